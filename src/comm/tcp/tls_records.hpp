#pragma once
// TLS 1.3 records (RFC 8446 section 5) sealed and opened outside OpenSSL once the handshake is over: each
// record's data is encrypted straight from the caller's buffer and decrypted straight into it, by the
// fastest engine of record_cipher.hpp. Either side switches its keys with a KeyUpdate message, after
// kRecordsPerKey records or when the peer asks; a record that fails is answered with a TLS alert.
#include <cstdint>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

#include "record_cipher.hpp"
#include "tls_keys.hpp"

namespace cohort::comm::tcp {

constexpr std::size_t kRecordHeaderBytes = 5;
constexpr std::size_t kMaxRecordData = 16 * 1024;
// What the peer may send: data, content type and padding, and the tag (RFC 8446 section 5.2).
constexpr std::size_t kMaxRecordBytes = kRecordHeaderBytes + kMaxRecordData + 256;

// TLS alert descriptions (RFC 8446 section 6) that records give.
enum class TlsAlert : unsigned char {
  CloseNotify = 0,
  UnexpectedMessage = 10,
  BadRecordMac = 20,
  RecordOverflow = 22,
  DecodeError = 50,
};

// Errors of the record layer: an alert's description found wrong here, or 256 + the description of an
// alert the peer sent (its close_notify is asio::error::eof instead).
const std::error_category& tls_record_category();
std::error_code record_error(TlsAlert alert);

// One direction's protection: its traffic keys, their cipher, and how many records it has protected under
// them, which numbers each record's nonce (RFC 8446 section 5.3).
class DirectionKeys {
 public:
  DirectionKeys(TrafficKeys keys, RecordEngine engine);
  RecordCipher& cipher() { return *cipher_; }
  // The nonce of the next record; count_record() moves past it.
  AeadNonce next_nonce() const;
  void count_record() { ++records_; }
  std::uint64_t records() const { return records_; }
  // Switches to the next generation of keys, as a KeyUpdate message asks.
  void update();
  std::uint64_t updates() const { return updates_; }

 private:
  TrafficKeys keys_;
  RecordEngine engine_;
  std::unique_ptr<RecordCipher> cipher_;
  std::uint64_t records_ = 0;
  std::uint64_t updates_ = 0;
};

class RecordWriter {
 public:
  // Within AES-GCM's limit of 2^24.5 full records under one key (RFC 8446 section 5.5).
  static constexpr std::uint64_t kRecordsPerKey = std::uint64_t{1} << 23;
  static constexpr std::size_t kKeyUpdateBytes = 5;  // handshake type, 3 bytes of length, request_update
  // The most one seal() writes: a KeyUpdate record, then a full record.
  static constexpr std::size_t kMaxSealBytes = 2 * (kRecordHeaderBytes + 1 + kAeadTagBytes) + kKeyUpdateBytes + kMaxRecordData;

  RecordWriter(TrafficKeys keys, RecordEngine engine, std::uint64_t records_per_key = kRecordsPerKey);

  // Seals `data` (at most kMaxRecordData bytes) as one record at `out`, which has room for kMaxSealBytes,
  // after a KeyUpdate when one is due; returns the bytes written.
  std::size_t seal(std::span<const unsigned char> data, unsigned char* out);
  // A fatal alert record telling the peer why this side gives up; returns the bytes written.
  std::size_t seal_alert(TlsAlert alert, unsigned char* out);
  // The peer asked this side to switch keys: it does before its next record.
  void answer_key_update() { key_update_due_ = true; }
  std::uint64_t key_updates() const { return keys_.updates(); }

 private:
  std::size_t seal_record(unsigned char type, std::span<const unsigned char> body, unsigned char* out);

  DirectionKeys keys_;
  std::uint64_t records_per_key_;
  bool key_update_due_ = false;
};

class RecordReader {
 public:
  RecordReader(TrafficKeys keys, RecordEngine engine);

  struct Progress {
    std::size_t consumed = 0;  // bytes of `incoming` taken
    std::size_t given = 0;     // bytes of data written to `out`
    bool key_update_requested = false;
  };
  // Gives `out` the data of the whole records at the front of `incoming`: first what a record left over,
  // then records decrypted straight into `out` while their data fits, and one more through a buffer of its
  // own, whose rest the next read gives. Stops at the first record that is not whole, when `out` is full,
  // or at an error (`error`; what came before it is given).
  Progress read(std::span<const unsigned char> incoming, std::span<unsigned char> out, std::error_code& error);
  std::uint64_t key_updates() const { return keys_.updates(); }

 private:
  // The content type of an opened record's inner plaintext, and the length of its content: the last byte
  // that is not padding. Empty when all of it is padding.
  static std::optional<std::pair<unsigned char, std::size_t>> content_of(std::span<const unsigned char> head, unsigned char tail);
  // Acts on a handshake record after the handshake: KeyUpdate switches keys, NewSessionTicket is ignored.
  std::error_code on_handshake(std::span<const unsigned char> messages, Progress& progress);

  DirectionKeys keys_;
  std::vector<unsigned char> leftover_;  // a record's data that did not fit the read that opened it
  std::size_t leftover_begin_ = 0, leftover_end_ = 0;
};

}  // namespace cohort::comm::tcp
