// Loom's exception types: one per kind of failure, each message naming the key, file,
// sample or rank at fault and what would be valid.
#pragma once
#include <stdexcept>
#include <string>

namespace loom {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ConfigError : Error {
  using Error::Error;
};
struct DataError : Error {
  using Error::Error;
};
struct CheckpointError : Error {
  using Error::Error;
};
struct DistributedError : Error {
  using Error::Error;
};
struct ModelError : Error {
  using Error::Error;
};
// The run itself went wrong: a loss or gradient norm that is not finite.
struct TrainingError : Error {
  using Error::Error;
};

}  // namespace loom
