#pragma once
// The exception hierarchy of cohort. Every error thrown by the library derives from cohort::Error;
// the subclass says who is at fault (docs/errors.md).

#include <stdexcept>
#include <string>

namespace cohort {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller broke a documented precondition at the API edge (bad shape, bad option value).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A file, socket or peer failed; the state on the other side is unknown.
class IoError : public Error {
 public:
  using Error::Error;
};

// A deadline passed before the operation completed.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Bytes that are corrupt, foreign or unauthenticated.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// A data or checkpoint file that cannot be trusted; the message names the file and the byte offset.
class DataError : public Error {
 public:
  using Error::Error;
};

// An operation asked of a device backend that this build or machine lacks.
class DeviceError : public Error {
 public:
  using Error::Error;
};

}  // namespace cohort
