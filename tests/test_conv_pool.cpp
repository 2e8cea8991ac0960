// Placeholder replaced by the family's tests.
