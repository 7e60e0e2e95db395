// Channel credentials for kvl's gRPC clients (`kvl chat`, `kvl health`):
// plaintext, TLS trusting a CA, or mTLS with a client certificate.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>

#include "absl/status/statusor.h"

namespace kvl::tools {

struct ClientTlsFiles {
  std::string ca_file;    // PEM; empty with no cert: plaintext
  std::string cert_file;  // PEM client certificate (mTLS), with key_file
  std::string key_file;
};

// Plaintext when no file is given; InvalidArgument when only one of
// cert_file/key_file is, or a file cannot be read (the message names it).
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeClientCredentials(
    const ClientTlsFiles& files);

// Adds `authorization: Bearer <key>` to a call when the environment variable
// KVL_API_KEY holds a key (kvl-server's auth.keys; an environment variable,
// not a flag, so that `ps` and shell history do not show it).
void AddApiKey(grpc::ClientContext* context);
// Whether KVL_API_KEY holds a key.
bool HasApiKey();

}  // namespace kvl::tools
