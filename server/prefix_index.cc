#include "server/prefix_index.h"

#include "base/sha256.h"

namespace kvl::server {

namespace {

// `text`, length-prefixed, so that no two sequences of fields share an encoding.
std::string Field(std::string_view text) {
  return std::to_string(text.size()) + ":" + std::string(text);
}

}  // namespace

PrefixIndex::Key PrefixIndex::Root(std::string_view tenant, std::string_view system_prompt) {
  return Sha256Hex("kvl-conversation\n" + Field(tenant) + Field(system_prompt));
}

PrefixIndex::Key PrefixIndex::Extend(const Key& key, std::string_view user,
                                     std::string_view assistant) {
  return Sha256Hex(key + Field(user) + Field(assistant));
}

std::optional<PrefixIndex::Hit> PrefixIndex::Take(const std::vector<Key>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = keys.size(); i-- > 0;) {
    auto it = entries_.find(keys[i]);
    if (it == entries_.end()) continue;
    Hit hit{std::move(it->second.session_id), i};
    lru_.erase(it->second.order);
    entries_.erase(it);
    return hit;
  }
  return std::nullopt;
}

std::vector<std::string> PrefixIndex::Put(const Key& key, const std::string& session_id) {
  std::vector<std::string> removed;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    if (it->second.session_id != session_id) removed.push_back(it->second.session_id);
    lru_.erase(it->second.order);
    entries_.erase(it);
  }
  lru_.push_back(key);
  entries_.emplace(key, Entry{session_id, std::prev(lru_.end())});
  while (static_cast<int64_t>(entries_.size()) > max_entries_) {
    auto oldest = entries_.find(lru_.front());
    removed.push_back(std::move(oldest->second.session_id));
    entries_.erase(oldest);
    lru_.pop_front();
  }
  return removed;
}

bool PrefixIndex::Forget(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.session_id != session_id) continue;
    lru_.erase(it->second.order);
    entries_.erase(it);
    return true;
  }
  return false;
}

int64_t PrefixIndex::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(entries_.size());
}

}  // namespace kvl::server
