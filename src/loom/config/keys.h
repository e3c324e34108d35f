// How a config section declares its keys, once each. A section has
//   template <class Keys> static void keys(Keys& k) { k(name, &Section::field, attributes...); ... }
// which names every key with its field and the checks on its value alone (see config.h). Reading
// (config.cpp), operator==, to_yaml (to_yaml.cpp) and the key tables docs/config.md must hold all walk that
// list; rules between keys stay code (config.cpp), naming keys by field (name_of), never by string.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::config::key {

// What a key may carry after its field. Reading applies them in this order: refused when the section
// does not read it (a data key's ReadBy), the value's type, then required, then the checks.

// Absent (or an empty list) is "missing required key 'training.steps' (hint)"; without a hint, the
// hint lists the key's one_of values.
struct Required {
  const char* hint;
};
template <class T>
struct AtLeast {  // "must be >= min, got v"
  T min;
};
template <class T>
struct AtMost {  // "must be <= max, got v": bounds a count before it is narrowed or allocated
  T max;
};
template <class T>
struct Above {  // "must be > bound, got v"
  T bound;
};
struct InUnitInterval {};  // [0, 1)
template <class T>
struct OneOf {  // "'v' is not one of a, b" (numbers unquoted)
  std::vector<T> values;
};
struct NotEmpty {    // a string, or each value of a mapping, must not be "" ("must not be empty (hint)");
  const char* hint;  // nullptr: the Required hint
};
struct NoEmptyEntry {  // a list of strings: "entry i is an empty <what>"
  const char* what;
};
struct IntegerOrAuto {};  // an integer >= 1, or `auto`, stored as 0
struct Names {            // a mapping of strings whose keys may only be these
  std::vector<std::string> valid;
};
// A key that is either a path (a string) or the file's fields inline (a YAML mapping, kept as JSON):
// exactly one of the two fields is set. `expected` says what the value may be.
template <class S>
struct PathOrMapping {
  std::string S::*path;
  nlohmann::json S::*mapping;
  const char* expected;
};

inline Required required(const char* hint = nullptr) { return {hint}; }
template <class T>
AtLeast<T> at_least(T min) {
  return {min};
}
template <class T>
AtMost<T> at_most(T max) {
  return {max};
}
template <class T>
Above<T> above(T bound) {
  return {bound};
}
inline InUnitInterval in_unit_interval() { return {}; }
inline OneOf<std::string> one_of(std::initializer_list<const char*> values) {
  return {{values.begin(), values.end()}};
}
inline OneOf<int64_t> one_of(std::initializer_list<int64_t> values) { return {values}; }
inline NotEmpty not_empty(const char* hint = nullptr) { return {hint}; }
inline NoEmptyEntry no_empty_entry(const char* what) { return {what}; }
inline IntegerOrAuto integer_or_auto() { return {}; }
inline Names names(std::initializer_list<const char*> valid) { return {{valid.begin(), valid.end()}}; }
template <class S>
PathOrMapping<S> path_or_mapping(std::string S::*path, nlohmann::json S::*mapping, const char* expected) {
  return {path, mapping, expected};
}

// The first attribute of type Want among `attributes`, or nullptr.
template <class Want>
const Want* find_attribute() {
  return nullptr;
}
template <class Want, class A, class... Rest>
const Want* find_attribute(const A& attribute, const Rest&... rest) {
  if constexpr (std::is_same_v<A, Want>)
    return &attribute;
  else
    return find_attribute<Want>(rest...);
}

namespace detail {

struct NameList {
  std::vector<std::string> names;
  template <class Field, class... A>
  void operator()(const char* name, const Field&, const A&...) {
    names.push_back(name);
  }
};

template <class T, class S>
struct NameOf {
  T S::*field;
  const char* name = nullptr;
  template <class F, class... A>
  void operator()(const char* key, const F& f, const A&...) {
    if constexpr (std::is_same_v<F, T S::*>) {
      if (f == field) name = key;
    } else if constexpr (std::is_same_v<F, PathOrMapping<S>> && std::is_same_v<T, std::string>) {
      if (f.path == field) name = key;
    } else if constexpr (std::is_same_v<F, PathOrMapping<S>> && std::is_same_v<T, nlohmann::json>) {
      if (f.mapping == field) name = key;
    }
  }
};

template <class T, class = void>
struct HasKeys : std::false_type {};
template <class T>
struct HasKeys<T, std::void_t<decltype(T::keys(std::declval<NameList&>()))>> : std::true_type {};

}  // namespace detail

// Whether T is a section: a struct with keys().
template <class T>
constexpr bool is_section = detail::HasKeys<T>::value;

// Whether T is a list of sections, e.g. data.datasets.
template <class T>
struct IsSectionList : std::false_type {};
template <class T>
struct IsSectionList<std::vector<T>> : std::bool_constant<is_section<T>> {};
template <class T>
constexpr bool is_section_list = IsSectionList<T>::value;

// The names S declares, in order.
template <class S>
std::vector<std::string> names_of() {
  detail::NameList list;
  S::keys(list);
  return list.names;
}

// The name S declares for `field`.
template <class T, class S>
const char* name_of(T S::*field) {
  detail::NameOf<T, S> finder{field};
  S::keys(finder);
  if (!finder.name) throw std::logic_error("a config field without a key");
  return finder.name;
}

}  // namespace loom::config::key
