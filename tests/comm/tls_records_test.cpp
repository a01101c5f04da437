// TLS 1.3 records sealed and opened outside OpenSSL (comm/tcp/tls_records.hpp), checked against OpenSSL's
// own TLS: one end of an in-memory connection is OpenSSL throughout, the other hands its records to a
// RecordWriter and a RecordReader once the handshake is over, on each engine the processor runs.
#include <asio/error.hpp>
#include <catch2/catch.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <numeric>
#include <string>
#include <vector>

#include "comm/tcp/record_cipher.hpp"
#include "comm/tcp/tls_context.hpp"
#include "comm/tcp/tls_keys.hpp"
#include "comm/tcp/tls_records.hpp"

using namespace cohort;
using namespace cohort::comm;
using tcp::RecordEngine;

namespace {

using Bytes = std::vector<unsigned char>;

Bytes pattern(std::size_t size, unsigned seed) {
  Bytes bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<unsigned char>((i * 131 + seed * 7 + i / 251) & 0xff);
  return bytes;
}

struct FreeSsl {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};

// Both ends of one TLS 1.3 connection in memory, with mutual certificates (PSK callbacks cannot key the
// SHA-384 suite), handshaken with the given suite.
class Connection {
 public:
  explicit Connection(const char* suite) : context_(certificates(), "") {
    for (auto* end : {&client_, &server_}) {
      end->reset(SSL_new(context_.context().native_handle()));
      REQUIRE(SSL_set_ciphersuites(end->get(), suite) == 1);
      SSL_set_bio(end->get(), BIO_new(BIO_s_mem()), BIO_new(BIO_s_mem()));
      tcp::keep_traffic_secrets(end->get());
    }
    SSL_set_connect_state(client_.get());
    SSL_set_accept_state(server_.get());
    bool client_done = false, server_done = false;
    for (int round = 0; round < 10 && !(client_done && server_done); ++round) {
      client_done = SSL_do_handshake(client_.get()) == 1 || client_done;
      move(client_.get(), server_.get());
      server_done = SSL_do_handshake(server_.get()) == 1 || server_done;
      move(server_.get(), client_.get());
    }
    REQUIRE(client_done);
    REQUIRE(server_done);
  }

  // The client's records from here on are sealed and opened outside OpenSSL.
  tcp::ConnectionKeys client_keys() { return tcp::connection_keys(client_.get()); }
  SSL* server() { return server_.get(); }

  // What the server (OpenSSL) sent since the last call.
  Bytes from_server() {
    Bytes bytes(BIO_ctrl_pending(SSL_get_wbio(server_.get())));
    if (!bytes.empty()) BIO_read(SSL_get_wbio(server_.get()), bytes.data(), static_cast<int>(bytes.size()));
    return bytes;
  }
  void to_server(const Bytes& bytes) { BIO_write(SSL_get_rbio(server_.get()), bytes.data(), static_cast<int>(bytes.size())); }
  // Everything the server can read now; an OpenSSL error's reason, if it fails, in `failure`.
  Bytes server_reads(std::string& failure) {
    Bytes got, piece(64 * 1024);
    std::size_t read = 0;
    ERR_clear_error();
    while (SSL_read_ex(server_.get(), piece.data(), piece.size(), &read) == 1) got.insert(got.end(), piece.begin(), piece.begin() + read);
    if (const unsigned long code = ERR_get_error(); code != 0) failure = ERR_reason_error_string(code);
    return got;
  }

 private:
  static TlsOptions certificates() {
    const std::string dir = COHORT_TEST_SOURCE_DIR "/comm/tls/";
    return {.enabled = true, .certificate = dir + "node.pem", .private_key = dir + "node.key", .ca = dir + "ca.pem"};
  }
  static void move(SSL* from, SSL* to) {
    Bytes bytes(BIO_ctrl_pending(SSL_get_wbio(from)));
    if (bytes.empty()) return;
    BIO_read(SSL_get_wbio(from), bytes.data(), static_cast<int>(bytes.size()));
    BIO_write(SSL_get_rbio(to), bytes.data(), static_cast<int>(bytes.size()));
  }

  tcp::TlsContext context_;
  std::unique_ptr<SSL, FreeSsl> client_, server_;
};

Bytes seal_all(tcp::RecordWriter& writer, const Bytes& data) {
  Bytes out;
  for (std::size_t at = 0; at == 0 || at < data.size();) {
    const std::size_t record = std::min(data.size() - at, tcp::kMaxRecordData);
    const std::size_t before = out.size();
    out.resize(before + tcp::RecordWriter::kMaxSealBytes);
    out.resize(before + writer.seal({data.data() + at, record}, out.data() + before));
    at += record;
    if (data.empty()) break;
  }
  return out;
}

// Reads `incoming` through `reader` into buffers of `piece` bytes, as a stream's reads would.
Bytes open_all(tcp::RecordReader& reader, const Bytes& incoming, std::size_t piece, std::error_code& error) {
  Bytes got;
  std::size_t consumed = 0;
  for (;;) {
    Bytes out(piece);
    const auto progress = reader.read({incoming.data() + consumed, incoming.size() - consumed}, out, error);
    consumed += progress.consumed;
    got.insert(got.end(), out.begin(), out.begin() + progress.given);
    if (error || (progress.given == 0 && progress.consumed == 0)) return got;
  }
}

}  // namespace

TEST_CASE("TLS records: every engine seals as OpenSSL does, and opens only what is authentic", "[comm][tls][security]") {
  const std::vector<std::pair<tcp::CipherSuite, std::size_t>> suites = {
      {tcp::CipherSuite::Aes128Gcm, 16}, {tcp::CipherSuite::Aes256Gcm, 32}, {tcp::CipherSuite::ChaCha20Poly1305, 32}};
  REQUIRE(tcp::record_engines().front() == RecordEngine::OpenSsl);
  for (const auto& [suite, key_bytes] : suites) {
    const Bytes key = pattern(key_bytes, 1), aad = pattern(5, 2);
    tcp::AeadNonce nonce{};
    nonce[3] = 9;
    auto reference = tcp::make_record_cipher(RecordEngine::OpenSsl, suite, key);
    for (const RecordEngine engine : tcp::record_engines()) {
      INFO(tcp::describe(engine) << ", suite " << static_cast<int>(suite));
      auto cipher = tcp::make_record_cipher(engine, suite, key);
      for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{1000}, tcp::kMaxRecordData}) {
        const Bytes body = pattern(size, 3);
        Bytes sealed(size + 1), expected(size + 1);
        unsigned char tag[tcp::kAeadTagBytes], expected_tag[tcp::kAeadTagBytes];
        cipher->seal(nonce, aad, body, 23, sealed.data(), tag);
        reference->seal(nonce, aad, body, 23, expected.data(), expected_tag);
        CHECK(sealed == expected);
        CHECK(std::equal(tag, tag + sizeof tag, expected_tag));
        // Opened by the other, split anywhere between head and tail.
        for (const std::size_t split : {std::size_t{0}, size / 2, size}) {
          Bytes opened(size + 1);
          CHECK(reference->open(nonce, aad, sealed, std::span(opened).first(split), std::span(opened).subspan(split), tag));
          CHECK(std::equal(body.begin(), body.end(), opened.begin()));
          CHECK(opened.back() == 23);
        }
        Bytes opened(size + 1);
        sealed[size / 2] ^= 1;
        CHECK_FALSE(cipher->open(nonce, aad, sealed, std::span(opened).first(size), std::span(opened).subspan(size), tag));
        sealed[size / 2] ^= 1;
        tcp::AeadNonce other = nonce;
        other[11] ^= 1;
        CHECK_FALSE(cipher->open(other, aad, sealed, std::span(opened).first(size), std::span(opened).subspan(size), tag));
      }
    }
  }
}

TEST_CASE("TLS records: OpenSSL's own TLS reads the records sealed here, and those it seals open here", "[comm][tls][security]") {
  for (const char* suite : {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}) {
    for (const RecordEngine engine : tcp::record_engines()) {
      INFO(suite << " on " << tcp::describe(engine));
      Connection connection(suite);
      tcp::ConnectionKeys keys = connection.client_keys();
      // Keys switch every 3 records, so that OpenSSL follows this side's KeyUpdates too.
      tcp::RecordWriter writer(std::move(keys.sending), engine, 3);
      tcp::RecordReader reader(std::move(keys.receiving), engine);

      const Bytes message = pattern(100000, 4);
      connection.to_server(seal_all(writer, message));
      std::string failure;
      CHECK(connection.server_reads(failure) == message);
      CHECK(failure.empty());
      CHECK(writer.key_updates() == 2);  // 7 records

      // OpenSSL's records, read in pieces smaller and larger than a record.
      const Bytes reply = pattern(70000, 5);
      for (const std::size_t piece : {std::size_t{7}, std::size_t{16 * 1024 - 3}, std::size_t{65536}}) {
        REQUIRE(SSL_write(connection.server(), reply.data(), static_cast<int>(reply.size())) == static_cast<int>(reply.size()));
        std::error_code error;
        CHECK(open_all(reader, connection.from_server(), piece, error) == reply);
        CHECK_FALSE(error);
      }

      // OpenSSL switches its keys and asks this side to switch too.
      REQUIRE(SSL_key_update(connection.server(), SSL_KEY_UPDATE_REQUESTED) == 1);
      REQUIRE(SSL_write(connection.server(), reply.data(), 1000) == 1000);
      std::error_code error;
      Bytes out(70000);
      Bytes updated = connection.from_server();
      const auto progress = reader.read(updated, out, error);
      CHECK_FALSE(error);
      CHECK(progress.key_update_requested);
      CHECK(progress.consumed == updated.size());
      CHECK(std::equal(out.begin(), out.begin() + progress.given, reply.begin()));
      CHECK(progress.given == 1000);
      CHECK(reader.key_updates() == 1);
      writer.answer_key_update();
      connection.to_server(seal_all(writer, Bytes(message.begin(), message.begin() + 500)));
      CHECK(connection.server_reads(failure) == Bytes(message.begin(), message.begin() + 500));
      CHECK(failure.empty());
      CHECK(writer.key_updates() == 3);

      // A record altered on the way is refused, and the alert that says so is OpenSSL's to read.
      REQUIRE(SSL_write(connection.server(), reply.data(), 2000) == 2000);
      Bytes altered = connection.from_server();
      altered[altered.size() / 2] ^= 0x40;
      error.clear();
      CHECK(reader.read(altered, out, error).given == 0);
      CHECK(error == tcp::record_error(tcp::TlsAlert::BadRecordMac));
      CHECK_THAT(error.message(), Catch::Contains("bad record mac"));
      Bytes alert(tcp::RecordWriter::kMaxSealBytes);
      alert.resize(writer.seal_alert(tcp::TlsAlert::BadRecordMac, alert.data()));
      connection.to_server(alert);
      CHECK(connection.server_reads(failure).empty());
      CHECK_THAT(failure, Catch::Contains("bad record mac"));
    }
  }
}

TEST_CASE("TLS records: a peer's alert, its close and malformed records are named", "[comm][tls][security]") {
  const RecordEngine engine = tcp::fastest_record_engine();
  {
    Connection connection("TLS_AES_128_GCM_SHA256");
    tcp::ConnectionKeys keys = connection.client_keys();
    tcp::RecordReader reader(std::move(keys.receiving), engine);
    const Bytes data = pattern(300, 6);
    REQUIRE(SSL_write(connection.server(), data.data(), static_cast<int>(data.size())) == 300);
    REQUIRE(SSL_shutdown(connection.server()) == 0);  // close_notify sent
    std::error_code error;
    CHECK(open_all(reader, connection.from_server(), 4096, error) == data);  // what came before the close is given
    CHECK(error == asio::error::eof);
  }
  {
    // The peer gives up on a record it cannot authenticate: its alert names why.
    Connection connection("TLS_AES_128_GCM_SHA256");
    tcp::ConnectionKeys keys = connection.client_keys();
    tcp::RecordWriter writer(std::move(keys.sending), engine);
    tcp::RecordReader reader(std::move(keys.receiving), engine);
    Bytes sealed = seal_all(writer, pattern(100, 7));
    sealed[20] ^= 1;
    connection.to_server(sealed);
    std::string failure;
    connection.server_reads(failure);
    CHECK_THAT(failure, Catch::Contains("bad record mac"));
    std::error_code error;
    Bytes out(100);
    reader.read(connection.from_server(), out, error);
    CHECK(error.category() == tcp::tls_record_category());
    CHECK_THAT(error.message(), Catch::Contains("the peer ended TLS with the alert \"bad record mac\""));
  }
  Connection connection("TLS_AES_128_GCM_SHA256");
  tcp::ConnectionKeys keys = connection.client_keys();
  struct Malformed {
    Bytes header;
    tcp::TlsAlert alert;
  };
  const std::vector<Malformed> malformed = {
      {{22, 3, 3, 0, 40}, tcp::TlsAlert::UnexpectedMessage},  // a handshake record in the clear
      {{23, 3, 3, 0x41, 0x01}, tcp::TlsAlert::RecordOverflow},  // 16641 bytes: one more than TLS allows
      {{23, 3, 3, 0, 16}, tcp::TlsAlert::BadRecordMac},         // shorter than a tag and a content type: cannot open
  };
  for (const auto& bad : malformed) {
    tcp::RecordReader reader(tcp::traffic_keys(keys.receiving.suite, keys.receiving.secret), engine);
    Bytes out(100);
    std::error_code error;
    // The header alone is enough to refuse: nothing waits for the body a peer may never send.
    const auto progress = reader.read(bad.header, out, error);
    CHECK(progress.given == 0);
    CHECK(error == tcp::record_error(bad.alert));
  }
}
