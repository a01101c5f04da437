#include "tls_stream.hpp"

#include <openssl/err.h>

#include <algorithm>
#include <system_error>

namespace cohort::comm::tcp {
namespace {

// TLS 1.3 adds at most this much to a record (header, content type, AEAD tag), with room to spare.
constexpr std::size_t kRecordOverhead = 64;
constexpr std::size_t kMaxPlainRecord = 16 * 1024;

}  // namespace

TlsStream::TlsStream(asio::ip::tcp::socket socket, asio::ssl::context& context)
    : socket_(std::move(socket)), ssl_(SSL_new(context.native_handle())) {
  BIO* internal = nullptr;
  BIO* network = nullptr;
  if (!ssl_ || BIO_new_bio_pair(&internal, kRingBytes, &network, kRingBytes) != 1)
    throw std::system_error(std::make_error_code(std::errc::not_enough_memory), "TLS connection state");
  SSL_set_bio(ssl_.get(), internal, internal);
  network_.reset(network);
  // A write's records are taken one at a time, only while the ring has room for them (encrypt()).
  SSL_set_mode(ssl_.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
}

std::size_t TlsStream::encrypt(asio::const_buffer buffer, asio::error_code& error) {
  const auto* data = static_cast<const unsigned char*>(buffer.data());
  std::size_t taken = 0;
  while (taken < buffer.size()) {
    const std::size_t room = BIO_ctrl_get_write_guarantee(SSL_get_wbio(ssl_.get()));
    if (room <= kRecordOverhead) break;
    const std::size_t record = std::min({buffer.size() - taken, kMaxPlainRecord, room - kRecordOverhead});
    std::size_t written = 0;
    ERR_clear_error();
    const int result = SSL_write_ex(ssl_.get(), data + taken, record, &written);
    if (result != 1) {
      error = failure(result);
      if (!error) error = asio::error::no_buffer_space;  // the room was measured: TLS wanted more than a record
      break;
    }
    taken += written;
  }
  return taken;
}

std::size_t TlsStream::decrypt(asio::mutable_buffer out, asio::error_code& error) {
  if (read_failure_) {
    error = read_failure_;
    return 0;
  }
  auto* data = static_cast<unsigned char*>(out.data());
  std::size_t given = 0;
  while (given < out.size()) {
    std::size_t read = 0;
    ERR_clear_error();
    const int result = SSL_read_ex(ssl_.get(), data + given, out.size() - given, &read);
    if (result == 1) {
      given += read;
      continue;
    }
    if (SSL_get_error(ssl_.get(), result) == SSL_ERROR_WANT_WRITE) {
      // TLS must answer (a key update) and the outgoing ring is full: only a peer flooding such requests gets here.
      error = asio::error::no_buffer_space;
    } else if (given == 0) {
      error = failure(result);
    } else {
      read_failure_ = failure(result);  // after the records before it are given: OpenSSL says why only once
    }
    break;
  }
  return given;
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
  char* space = nullptr;
  const int bytes = BIO_nwrite0(network_.get(), &space);
  return bytes > 0 ? asio::mutable_buffer(space, static_cast<std::size_t>(bytes)) : asio::mutable_buffer();
}

void TlsStream::took_in(std::size_t bytes) {
  char* space = nullptr;
  BIO_nwrite(network_.get(), &space, static_cast<int>(bytes));
}

asio::const_buffer TlsStream::outgoing() {
  char* pending = nullptr;
  const int bytes = BIO_nread0(network_.get(), &pending);
  return bytes > 0 ? asio::const_buffer(pending, static_cast<std::size_t>(bytes)) : asio::const_buffer();
}

void TlsStream::sent(std::size_t bytes) {
  char* pending = nullptr;
  BIO_nread(network_.get(), &pending, static_cast<int>(bytes));
}

}  // namespace cohort::comm::tcp
