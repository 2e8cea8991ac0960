// Node attributes: a small ordered name -> value list. Every op declares its attributes
// (name, type, default) in its schema; a node always carries all of them, defaults
// filled in, so kernels read them without checking for presence.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace seam {

using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string>;

std::string attr_str(const AttrValue& v);
const char* attr_type_name(const AttrValue& v);

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  bool has(std::string_view name) const;
  void set(std::string name, AttrValue value);
  const AttrValue& get(std::string_view name) const;

  int64_t i(std::string_view name) const;
  double f(std::string_view name) const;  // accepts an int attribute too
  const std::vector<int64_t>& ints(std::string_view name) const;
  const std::string& s(std::string_view name) const;

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  std::string str() const;  // "axis=1, eps=1e-05"
  bool operator==(const Attrs&) const = default;

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;
};

}  // namespace seam
