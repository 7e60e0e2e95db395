#include "tools/client_credentials.h"

#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "base/files.h"

namespace kvl::tools {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeClientCredentials(
    const ClientTlsFiles& files) {
  if (files.cert_file.empty() != files.key_file.empty()) {
    return absl::InvalidArgumentError("--cert and --key go together");
  }
  if (files.ca_file.empty() && files.cert_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions tls;
  for (const auto& [file, out] :
       {std::pair<const std::string&, std::string*>{files.ca_file, &tls.pem_root_certs},
        {files.cert_file, &tls.pem_cert_chain},
        {files.key_file, &tls.pem_private_key}}) {
    if (file.empty()) continue;
    absl::StatusOr<std::string> text = ReadTextFile(file);
    if (!text.ok()) return text.status();
    *out = *std::move(text);
  }
  return grpc::SslCredentials(tls);
}

bool HasApiKey() {
  const char* key = std::getenv("KVL_API_KEY");
  return key != nullptr && *key != '\0';
}

void AddApiKey(grpc::ClientContext* context) {
  if (HasApiKey()) {
    context->AddMetadata("authorization", std::string("Bearer ") + std::getenv("KVL_API_KEY"));
  }
}

}  // namespace kvl::tools
