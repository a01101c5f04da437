#include "tls_stream.hpp"

#include <openssl/err.h>

#include <algorithm>
#include <cstring>
#include <system_error>

#include "tls_keys.hpp"

namespace cohort::comm::tcp {

TlsStream::TlsStream(asio::ip::tcp::socket socket, asio::ssl::context& context, RecordEngine engine)
    : socket_(std::move(socket)),
      engine_(engine),
      ssl_(SSL_new(context.native_handle())),
      outgoing_(kWriteBatch + 2 * RecordWriter::kMaxSealBytes),  // a batch, then what a read answers
      incoming_(kReadBytes + kMaxRecordBytes) {
  BIO* from_peer = BIO_new(BIO_s_mem());
  BIO* to_peer = BIO_new(BIO_s_mem());
  if (!ssl_ || from_peer == nullptr || to_peer == nullptr) {
    BIO_free(from_peer);
    BIO_free(to_peer);
    throw std::system_error(std::make_error_code(std::errc::not_enough_memory), "TLS connection state");
  }
  SSL_set_bio(ssl_.get(), from_peer, to_peer);
  keep_traffic_secrets(ssl_.get());
}

void TlsStream::give_openssl_incoming() {
  const std::size_t pending = incoming_end_ - incoming_begin_;
  if (pending == 0) return;
  BIO_write(SSL_get_rbio(ssl_.get()), incoming_.data() + incoming_begin_, static_cast<int>(pending));
  incoming_begin_ = incoming_end_ = 0;
}

void TlsStream::take_openssl_outgoing() {
  BIO* to_peer = SSL_get_wbio(ssl_.get());
  while (BIO_ctrl_pending(to_peer) > 0 && outgoing_end_ < outgoing_.size()) {
    const int read = BIO_read(to_peer, outgoing_.data() + outgoing_end_, static_cast<int>(outgoing_.size() - outgoing_end_));
    if (read <= 0) break;
    outgoing_end_ += static_cast<std::size_t>(read);
  }
}

void TlsStream::take_over_records() {
  ConnectionKeys keys = connection_keys(ssl_.get());
  writer_.emplace(std::move(keys.sending), engine_);
  reader_.emplace(std::move(keys.receiving), engine_);
  // OpenSSL reads a record's header, then its body, never past it: what it holds is the peer's first records.
  BIO* from_peer = SSL_get_rbio(ssl_.get());
  const std::size_t unread = BIO_ctrl_pending(from_peer);
  if (unread > incoming_.size()) incoming_.resize(unread);
  const int taken = unread > 0 ? BIO_read(from_peer, incoming_.data(), static_cast<int>(unread)) : 0;
  incoming_begin_ = 0;
  incoming_end_ = taken > 0 ? static_cast<std::size_t>(taken) : 0;
  ssl_.reset();
}

std::size_t TlsStream::seal(asio::const_buffer buffer) {
  const auto* data = static_cast<const unsigned char*>(buffer.data());
  std::size_t taken = 0;
  while (taken < buffer.size() && outgoing_.size() - outgoing_end_ >= RecordWriter::kMaxSealBytes) {
    const std::size_t record = std::min(buffer.size() - taken, kMaxRecordData);
    outgoing_end_ += writer_->seal({data + taken, record}, outgoing_.data() + outgoing_end_);
    taken += record;
  }
  return taken;
}

std::size_t TlsStream::open(asio::mutable_buffer out, asio::error_code& error) {
  if (read_failure_) {
    error = read_failure_;
    return 0;
  }
  std::error_code failed;
  const RecordReader::Progress progress =
      reader_->read({incoming_.data() + incoming_begin_, incoming_end_ - incoming_begin_},
                    {static_cast<unsigned char*>(out.data()), out.size()}, failed);
  incoming_begin_ += progress.consumed;
  if (incoming_begin_ == incoming_end_) incoming_begin_ = incoming_end_ = 0;
  if (progress.key_update_requested) writer_->answer_key_update();
  if (failed) {
    // Tell the peer why, unless it ended the connection itself. Every later read fails alike.
    if (failed.category() == tls_record_category() && failed.value() < 256 &&
        outgoing_.size() - outgoing_end_ >= RecordWriter::kMaxSealBytes)
      outgoing_end_ += writer_->seal_alert(static_cast<TlsAlert>(failed.value()), outgoing_.data() + outgoing_end_);
    read_failure_ = failed;
    if (progress.given == 0) error = failed;  // else after the data before it is given
  }
  return progress.given;
}

asio::error_code TlsStream::failure(int result) {
  switch (SSL_get_error(ssl_.get(), result)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      return {};
    case SSL_ERROR_ZERO_RETURN:
      return asio::error::eof;
    default:
      if (const unsigned long code = ERR_get_error(); code != 0) {
        ERR_clear_error();
        return {static_cast<int>(code), asio::error::get_ssl_category()};
      }
      return std::make_error_code(std::errc::protocol_error);
  }
}

asio::mutable_buffer TlsStream::incoming_space() {
  // What is left of a partial record moves to the front: a read takes at most kReadBytes.
  if (incoming_begin_ > 0) {
    std::memmove(incoming_.data(), incoming_.data() + incoming_begin_, incoming_end_ - incoming_begin_);
    incoming_end_ -= incoming_begin_;
    incoming_begin_ = 0;
  }
  return {incoming_.data() + incoming_end_, incoming_.size() - incoming_end_};
}

void TlsStream::sent(std::size_t bytes) {
  outgoing_begin_ += bytes;
  if (outgoing_begin_ == outgoing_end_) outgoing_begin_ = outgoing_end_ = 0;
}

}  // namespace cohort::comm::tcp
