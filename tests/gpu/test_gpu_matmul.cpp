// Placeholder: GPU tests of this family are being written.
