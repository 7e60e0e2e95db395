#include "tests/testing/grpc_probe.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/str_cat.h"

namespace kvl::testing {
namespace {

using google::protobuf::internal::WireFormatLite;

std::string EncodeStringField(int field, const std::string& value) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint32(static_cast<uint32_t>(value.size()));
    coded.WriteString(value);
  }
  return out;
}

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromByteBuffer(const grpc::ByteBuffer& buffer) {
  grpc::Slice slice;
  if (!buffer.DumpToSingleSlice(&slice).ok()) return "";
  return std::string(reinterpret_cast<const char*>(slice.begin()), slice.size());
}

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  // absl and gRPC share the canonical code numbers.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

// Calls `visit(field, wire_type, coded)` for each field of `bytes`; `visit`
// must consume the field's value or return false to have it skipped.
template <typename Visit>
bool ForEachField(const std::string& bytes, Visit visit) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  while (uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const auto type = WireFormatLite::GetTagWireType(tag);
    if (!visit(field, type, in) && !WireFormatLite::SkipField(&in, tag)) return false;
  }
  return in.ConsumedEntireMessage();
}

bool ReadLengthDelimited(google::protobuf::io::CodedInputStream& in, std::string* out) {
  uint32_t size = 0;
  return in.ReadVarint32(&size) && in.ReadString(out, static_cast<int>(size));
}

bool Await(grpc::CompletionQueue& cq, void* expected,
           std::chrono::system_clock::time_point deadline) {
  void* tag = nullptr;
  bool ok = false;
  if (cq.AsyncNext(&tag, &ok, deadline) != grpc::CompletionQueue::GOT_EVENT) return false;
  return tag == expected && ok;
}

}  // namespace

std::shared_ptr<grpc::Channel> InsecureChannel(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

absl::StatusOr<HealthStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                         const std::string& service,
                                         std::chrono::milliseconds timeout) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::CompletionQueue cq;
  // HealthCheckRequest { string service = 1; }
  const grpc::ByteBuffer request =
      ToByteBuffer(service.empty() ? "" : EncodeStringField(1, service));
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer reply;
  grpc::Status status;
  int tag = 0;
  call->Finish(&reply, &status, &tag);
  void* got = nullptr;
  bool ok = false;
  cq.Next(&got, &ok);
  if (!status.ok()) return FromGrpc(status, absl::StrCat("Health/Check('", service, "')"));
  // HealthCheckResponse { ServingStatus status = 1; }; absent means UNKNOWN.
  int64_t serving = 0;
  const bool parsed = ForEachField(FromByteBuffer(reply), [&](int field, auto type, auto& in) {
    if (field != 1 || type != WireFormatLite::WIRETYPE_VARINT) return false;
    uint64_t v = 0;
    in.ReadVarint64(&v);
    serving = static_cast<int64_t>(v);
    return true;
  });
  if (!parsed) return absl::DataLossError("Health/Check: malformed response");
  return static_cast<HealthStatus>(serving);
}

absl::StatusOr<std::vector<std::string>> ListServicesByReflection(
    const std::shared_ptr<grpc::Channel>& channel, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::system_clock::now() + timeout;
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(deadline);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  int start = 0, write = 0, done = 0, read = 0, finish = 0;
  call->StartCall(&start);
  if (!Await(cq, &start, deadline)) return absl::UnavailableError("reflection: call did not start");
  // ServerReflectionRequest { oneof { string list_services = 7; ... } }
  call->Write(ToByteBuffer(EncodeStringField(7, "")), &write);
  if (!Await(cq, &write, deadline)) return absl::UnavailableError("reflection: write failed");
  call->WritesDone(&done);
  if (!Await(cq, &done, deadline)) return absl::UnavailableError("reflection: writes-done failed");
  grpc::ByteBuffer reply;
  call->Read(&reply, &read);
  const bool got_reply = Await(cq, &read, deadline);
  grpc::Status status;
  call->Finish(&status, &finish);
  Await(cq, &finish, deadline);
  if (!status.ok()) return FromGrpc(status, "reflection");
  if (!got_reply) return absl::DataLossError("reflection: no response message");

  // ServerReflectionResponse { ListServiceResponse list_services_response = 6;
  //                            ErrorResponse error_response = 7; }
  // ListServiceResponse { repeated ServiceResponse service = 1; }
  // ServiceResponse { string name = 1; }
  std::vector<std::string> names;
  std::string error;
  auto string_field_1 = [](const std::string& bytes, std::vector<std::string>* out) {
    return ForEachField(bytes, [&](int field, auto type, auto& in) {
      if (field != 1 || type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) return false;
      std::string value;
      if (!ReadLengthDelimited(in, &value)) return false;
      out->push_back(std::move(value));
      return true;
    });
  };
  const bool parsed = ForEachField(FromByteBuffer(reply), [&](int field, auto type, auto& in) {
    if (type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED || (field != 6 && field != 7))
      return false;
    std::string nested;
    if (!ReadLengthDelimited(in, &nested)) return false;
    if (field == 7) {
      error = nested;
      return true;
    }
    std::vector<std::string> services;
    string_field_1(nested, &services);
    for (const std::string& service : services) {
      std::vector<std::string> name;
      string_field_1(service, &name);
      if (!name.empty()) names.push_back(name.front());
    }
    return true;
  });
  if (!parsed) return absl::DataLossError("reflection: malformed response");
  if (!error.empty())
    return absl::InternalError("reflection: the server answered with an error_response");
  return names;
}

}  // namespace kvl::testing
