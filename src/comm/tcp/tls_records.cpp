#include "tls_records.hpp"

#include <asio/error.hpp>
#include <openssl/ssl.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "cohort/core/error.hpp"

namespace cohort::comm::tcp {
namespace {

constexpr unsigned char kAlert = 21, kHandshake = 22, kApplicationData = 23;
constexpr unsigned char kNewSessionTicket = 4, kKeyUpdate = 24;
constexpr int kPeerAlert = 256;

class RecordCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "tls record"; }
  std::string message(int value) const override {
    const bool peer = value >= kPeerAlert;
    const auto alert = static_cast<TlsAlert>(value % kPeerAlert);
    const std::string named = SSL_alert_desc_string_long(value % kPeerAlert);
    if (peer) return "the peer ended TLS with the alert \"" + named + "\"";
    switch (alert) {
      case TlsAlert::BadRecordMac:
        return "a TLS record failed authentication (bad record mac): altered on the way, or not sealed by the peer";
      case TlsAlert::RecordOverflow:
        return "a TLS record is longer than TLS allows (record overflow)";
      case TlsAlert::UnexpectedMessage:
        return "a TLS record of a kind the connection does not take once set up (unexpected message)";
      default:
        return "a malformed TLS record (" + named + ")";
    }
  }
};

// The record's nonce: its sequence number, big-endian in the last 8 bytes, XOR the IV.
AeadNonce nonce_of(const AeadNonce& iv, std::uint64_t sequence) {
  AeadNonce nonce = iv;
  for (std::size_t i = 0; i < 8; ++i) nonce[kAeadNonceBytes - 1 - i] ^= static_cast<unsigned char>(sequence >> (8 * i));
  return nonce;
}

void write_header(unsigned char* out, std::size_t length) {
  out[0] = kApplicationData;  // every protected record claims it (RFC 8446 section 5.2)
  out[1] = 0x03;
  out[2] = 0x03;
  out[3] = static_cast<unsigned char>(length >> 8);
  out[4] = static_cast<unsigned char>(length);
}

}  // namespace

const std::error_category& tls_record_category() {
  static const RecordCategory category;
  return category;
}

std::error_code record_error(TlsAlert alert) { return {static_cast<int>(alert), tls_record_category()}; }

DirectionKeys::DirectionKeys(TrafficKeys keys, RecordEngine engine)
    : keys_(std::move(keys)), engine_(engine), cipher_(make_record_cipher(engine, keys_.suite, keys_.key)) {}

AeadNonce DirectionKeys::next_nonce() const { return nonce_of(keys_.iv, records_); }

void DirectionKeys::update() {
  keys_ = next_generation(keys_);
  cipher_ = make_record_cipher(engine_, keys_.suite, keys_.key);
  records_ = 0;
  ++updates_;
}

RecordWriter::RecordWriter(TrafficKeys keys, RecordEngine engine, std::uint64_t records_per_key)
    : keys_(std::move(keys), engine), records_per_key_(records_per_key) {}

std::size_t RecordWriter::seal(std::span<const unsigned char> data, unsigned char* out) {
  std::size_t written = 0;
  if (key_update_due_ || keys_.records() >= records_per_key_) {
    const unsigned char key_update[kKeyUpdateBytes] = {kKeyUpdate, 0, 0, 1, 0};  // update_not_requested
    written = seal_record(kHandshake, key_update, out);
    keys_.update();
    key_update_due_ = false;
  }
  return written + seal_record(kApplicationData, data, out + written);
}

std::size_t RecordWriter::seal_alert(TlsAlert alert, unsigned char* out) {
  const unsigned char fatal[2] = {2, static_cast<unsigned char>(alert)};
  return seal_record(kAlert, fatal, out);
}

std::size_t RecordWriter::seal_record(unsigned char type, std::span<const unsigned char> body, unsigned char* out) {
  const std::size_t length = body.size() + 1 + kAeadTagBytes;
  write_header(out, length);
  keys_.cipher().seal(keys_.next_nonce(), {out, kRecordHeaderBytes}, body, type, out + kRecordHeaderBytes,
                     out + kRecordHeaderBytes + body.size() + 1);
  keys_.count_record();
  return kRecordHeaderBytes + length;
}

RecordReader::RecordReader(TrafficKeys keys, RecordEngine engine)
    : keys_(std::move(keys), engine), leftover_(kMaxRecordBytes) {}

std::optional<std::pair<unsigned char, std::size_t>> RecordReader::content_of(std::span<const unsigned char> head, unsigned char tail) {
  if (tail != 0) return std::pair{tail, head.size()};
  for (std::size_t i = head.size(); i > 0; --i)
    if (head[i - 1] != 0) return std::pair{head[i - 1], i - 1};
  return std::nullopt;
}

RecordReader::Progress RecordReader::read(std::span<const unsigned char> incoming, std::span<unsigned char> out,
                                          std::error_code& error) {
  Progress progress;
  const std::size_t kept = std::min(leftover_end_ - leftover_begin_, out.size());
  std::memcpy(out.data(), leftover_.data() + leftover_begin_, kept);
  leftover_begin_ += kept;
  progress.given = kept;
  while (progress.given < out.size() && incoming.size() - progress.consumed >= kRecordHeaderBytes) {
    const unsigned char* header = incoming.data() + progress.consumed;
    const std::size_t length = std::size_t{header[3]} << 8 | header[4];
    if (header[0] != kApplicationData) {
      error = record_error(TlsAlert::UnexpectedMessage);
      break;
    }
    if (length > kMaxRecordBytes - kRecordHeaderBytes) {
      error = record_error(TlsAlert::RecordOverflow);
      break;
    }
    if (length < 1 + kAeadTagBytes) {  // too short for a content type and a tag: failed authentication
      error = record_error(TlsAlert::BadRecordMac);
      break;
    }
    if (incoming.size() - progress.consumed < kRecordHeaderBytes + length) break;
    const std::span<const unsigned char> ciphertext(header + kRecordHeaderBytes, length - kAeadTagBytes);
    const unsigned char* tag = ciphertext.data() + ciphertext.size();
    const std::size_t room = out.size() - progress.given;
    // Straight into `out` when the record's data fits (its last byte, the content type at the least, goes
    // to `tail`); else whole into the leftover buffer.
    const bool straight = ciphertext.size() - 1 <= room;
    unsigned char tail = 0;
    const std::span<unsigned char> head = straight ? out.subspan(progress.given, ciphertext.size() - 1)
                                                   : std::span<unsigned char>(leftover_.data(), ciphertext.size() - 1);
    if (!keys_.cipher().open(keys_.next_nonce(), {header, kRecordHeaderBytes}, ciphertext, head, {&tail, 1}, tag)) {
      error = record_error(TlsAlert::BadRecordMac);
      break;
    }
    keys_.count_record();
    progress.consumed += kRecordHeaderBytes + length;
    const auto content = content_of(head, tail);
    if (!content) {
      error = record_error(TlsAlert::UnexpectedMessage);
      break;
    }
    const auto [type, size] = *content;
    if (type == kApplicationData) {
      if (straight) {
        progress.given += size;
        continue;
      }
      leftover_begin_ = 0;
      leftover_end_ = size;
      const std::size_t now = std::min(room, size);
      std::memcpy(out.data() + progress.given, leftover_.data(), now);
      leftover_begin_ = now;
      progress.given += now;
      continue;
    }
    if (type == kHandshake) {
      error = on_handshake(head.first(size), progress);
      if (error) break;
      continue;
    }
    if (type == kAlert && size == 2) {
      error = head[1] == static_cast<unsigned char>(TlsAlert::CloseNotify) ? std::error_code(asio::error::eof)
                                                                            : std::error_code(kPeerAlert + head[1], tls_record_category());
      break;
    }
    error = record_error(type == kAlert ? TlsAlert::DecodeError : TlsAlert::UnexpectedMessage);
    break;
  }
  return progress;
}

std::error_code RecordReader::on_handshake(std::span<const unsigned char> messages, Progress& progress) {
  // Whole messages only: a handshake message split across records is refused (nothing sent after the
  // handshake needs one).
  while (!messages.empty()) {
    if (messages.size() < 4) return record_error(TlsAlert::UnexpectedMessage);
    const std::size_t length = std::size_t{messages[1]} << 16 | std::size_t{messages[2]} << 8 | messages[3];
    if (messages.size() - 4 < length) return record_error(TlsAlert::UnexpectedMessage);
    if (messages[0] == kKeyUpdate) {
      // Only at the end of its record: the next record is under the new keys (RFC 8446 section 5.1).
      if (length != 1 || messages[4] > 1 || messages.size() != 5) return record_error(TlsAlert::DecodeError);
      if (messages[4] == 1) progress.key_update_requested = true;
      keys_.update();
    } else if (messages[0] != kNewSessionTicket) {
      return record_error(TlsAlert::UnexpectedMessage);
    }
    messages = messages.subspan(4 + length);
  }
  return {};
}

}  // namespace cohort::comm::tcp
