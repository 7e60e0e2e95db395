#include "server/prefix_index.h"

#include <algorithm>
#include <iterator>

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
    auto it = owner_.find(keys[i]);
    if (it == owner_.end()) continue;
    Session& session = sessions_.at(it->second);
    if (session.held) continue;
    session.held = true;
    return Hit{it->second, i, session.head == keys[i]};
  }
  return std::nullopt;
}

std::vector<std::string> PrefixIndex::Put(const std::vector<Key>& keys,
                                          const std::string& session_id) {
  std::vector<std::string> removed;
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = sessions_.try_emplace(session_id);
  Session& session = it->second;
  if (fresh) {
    lru_.push_back(session_id);
  } else {
    lru_.splice(lru_.end(), lru_, session.order);
  }
  session.order = std::prev(lru_.end());
  session.held = false;
  for (const Key& key : keys) {
    auto [at, added] = owner_.try_emplace(key, session_id);
    if (!added && at->second != session_id) {
      const std::string other = at->second;
      Session& o = sessions_.at(other);
      if (o.head == key && !o.held) {
        removed.push_back(other);
        Erase(other);
      } else {
        o.keys.erase(std::find(o.keys.begin(), o.keys.end(), key));
      }
      owner_[key] = session_id;
    }
    if (std::find(session.keys.begin(), session.keys.end(), key) == session.keys.end()) {
      session.keys.push_back(key);
    }
  }
  if (!keys.empty()) session.head = keys.back();
  for (auto next = lru_.begin();
       static_cast<int64_t>(sessions_.size()) > max_sessions_ && next != lru_.end();) {
    const std::string id = *next++;
    if (sessions_.at(id).held || id == session_id) continue;
    removed.push_back(id);
    Erase(id);
  }
  return removed;
}

void PrefixIndex::Release(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = sessions_.find(session_id); it != sessions_.end()) it->second.held = false;
}

bool PrefixIndex::Forget(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sessions_.count(session_id) == 0) return false;
  Erase(session_id);
  return true;
}

void PrefixIndex::Erase(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  for (const Key& key : it->second.keys) {
    if (auto o = owner_.find(key); o != owner_.end() && o->second == session_id) owner_.erase(o);
  }
  lru_.erase(it->second.order);
  sessions_.erase(it);
}

int64_t PrefixIndex::sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(sessions_.size());
}

}  // namespace kvl::server
