// Node attributes.
#include "seam/attrs.h"

#include <sstream>

#include "seam/error.h"

namespace seam {

std::string attr_str(const AttrValue& v) {
  std::ostringstream s;
  if (auto* i = std::get_if<int64_t>(&v)) s << *i;
  else if (auto* f = std::get_if<double>(&v)) s << *f;
  else if (auto* is = std::get_if<std::vector<int64_t>>(&v)) {
    s << "[";
    for (size_t k = 0; k < is->size(); ++k) s << (k ? "," : "") << (*is)[k];
    s << "]";
  } else s << '"' << std::get<std::string>(v) << '"';
  return s.str();
}

const char* attr_type_name(const AttrValue& v) {
  switch (v.index()) {
    case 0: return "int";
    case 1: return "float";
    case 2: return "int list";
    default: return "string";
  }
}

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) : items_(items) {}

bool Attrs::has(std::string_view name) const {
  for (auto& [k, v] : items_)
    if (k == name) return true;
  return false;
}

void Attrs::set(std::string name, AttrValue value) {
  for (auto& [k, v] : items_)
    if (k == name) {
      v = std::move(value);
      return;
    }
  items_.emplace_back(std::move(name), std::move(value));
}

const AttrValue& Attrs::get(std::string_view name) const {
  for (auto& [k, v] : items_)
    if (k == name) return v;
  fail("internal error: attribute '", name, "' missing");
}

int64_t Attrs::i(std::string_view name) const {
  auto& v = get(name);
  if (auto* p = std::get_if<int64_t>(&v)) return *p;
  fail("attribute '", name, "' is a ", attr_type_name(v), ", expected an int");
}

double Attrs::f(std::string_view name) const {
  auto& v = get(name);
  if (auto* p = std::get_if<double>(&v)) return *p;
  if (auto* p = std::get_if<int64_t>(&v)) return static_cast<double>(*p);
  fail("attribute '", name, "' is a ", attr_type_name(v), ", expected a float");
}

const std::vector<int64_t>& Attrs::ints(std::string_view name) const {
  auto& v = get(name);
  if (auto* p = std::get_if<std::vector<int64_t>>(&v)) return *p;
  fail("attribute '", name, "' is a ", attr_type_name(v), ", expected an int list");
}

const std::string& Attrs::s(std::string_view name) const {
  auto& v = get(name);
  if (auto* p = std::get_if<std::string>(&v)) return *p;
  fail("attribute '", name, "' is a ", attr_type_name(v), ", expected a string");
}

std::string Attrs::str() const {
  std::string r;
  for (auto& [k, v] : items_) r += (r.empty() ? "" : ", ") + k + "=" + attr_str(v);
  return r;
}

}  // namespace seam
