// The exact-answer task generators of the chat-data set (docs/data.md).
//
// The wording here is a contract with scripts/oracles/check_suite.py, which re-derives
// every answer from the conversation text with its own parser: a template
// changed here must be changed there too (the C++ test runs the checker).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "datagen/chat_data.h"
#include "datagen/chat_data_grammar.h"
#include "datagen/chat_data_rng.h"

namespace kvl::datagen {
namespace {

constexpr const char* kSystemPrompts[] = {
    "You are a helpful assistant.",
    "You are a helpful assistant. Answer briefly.",
    "You are a careful assistant. Keep answers short.",
    "Answer with a single word or number when you can.",
};
constexpr const char* kAcks[] = {"Got it.", "Okay, I will remember that.", "Noted.",
                                 "Thanks, noted.", "Understood.", "All right."};
constexpr const char* kOrdinals[] = {"first", "second", "third", "fourth", "fifth", "sixth",
                                     "seventh", "eighth", "ninth", "tenth", "eleventh", "twelfth"};
constexpr int kNumOrdinals = 12;

// Facts vocabulary (disjoint word sets per kind so a key names one kind).
constexpr const char* kAnimals[] = {"cat", "dog", "parrot", "rabbit", "hamster", "goldfish",
                                    "turtle", "horse", "pony", "ferret", "canary", "lizard"};
constexpr const char* kPetNames[] = {"Biscuit", "Pepper", "Luna",  "Milo",   "Oscar",  "Daisy", "Rocky",
                                     "Coco",    "Ziggy",  "Noodle", "Mango", "Pickles", "Shadow", "Ginger",
                                     "Waffles", "Peanut", "Muffin", "Bean",  "Tofu",   "Socks",  "Pixel"};
constexpr const char* kEvents[] = {"meeting",      "dentist appointment", "piano lesson", "team lunch",
                                   "book club",    "yoga class",          "job interview", "soccer practice",
                                   "board review", "school play",         "haircut",       "car service"};
constexpr const char* kDays[] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"};
constexpr const char* kRelations[] = {"sister", "brother", "cousin", "aunt", "uncle", "friend",
                                      "neighbor", "grandmother", "grandfather", "colleague"};
constexpr const char* kPeople[] = {"Alice", "Ben",   "Carla", "David", "Elena", "Farid", "Grace",
                                   "Hugo",  "Ines",  "Jonas", "Kenji", "Lena",  "Marco", "Nadia",
                                   "Omar",  "Priya", "Quinn", "Rosa",  "Sven",  "Tara",  "Umar",
                                   "Vera",  "Wen",   "Yusuf", "Zoe",   "Maya",  "Leo",   "Iris"};
constexpr const char* kCities[] = {"Lisbon", "Oslo",   "Cairo",  "Denver",   "Madrid", "Toronto", "Nairobi",
                                   "Lima",   "Dublin", "Vienna", "Prague",   "Seoul",  "Osaka",   "Quito",
                                   "Perth",  "Austin", "Boston", "Chicago",  "Paris",  "Berlin",  "Rome",
                                   "Athens", "Delhi",  "Manila", "Hanoi",    "Bogota", "Helsinki", "Warsaw"};
constexpr const char* kNumbered[] = {"locker", "room", "seat", "table", "bus", "gate",
                                     "badge", "platform", "cabin", "desk", "ticket", "order"};
constexpr const char* kObjects[] = {"wallet", "umbrella", "notebook", "charger", "passport",
                                    "scarf",  "backpack", "laptop",   "camera",  "jacket"};
constexpr const char* kRooms[] = {"kitchen", "garage", "car",    "office", "hallway", "bedroom",
                                  "garden",  "basement", "attic", "closet", "bathroom", "shed"};

// Key-value vocabulary.
constexpr const char* kValueWords[] = {
    "amber",  "apple",  "basil",  "birch",  "cobalt", "copper", "coral",  "cedar",  "daisy",  "delta",
    "ember",  "falcon", "fern",   "garnet", "ginger", "granite", "hazel", "indigo", "iris",   "ivory",
    "jade",   "juniper", "kelp",  "lemon",  "lilac",  "linen",  "maple",  "marble", "meadow", "mint",
    "nickel", "oak",    "olive",  "onyx",   "opal",   "orchid", "pearl",  "pepper", "pine",   "plum",
    "quartz", "raven",  "river",  "ruby",   "saffron", "sage",  "silver", "slate",  "spruce", "storm",
    "tango",  "teal",   "thistle", "tin",   "topaz",  "tulip",  "umber",  "velvet", "violet", "walnut",
    "willow", "zinc",   "zephyr", "cloud",  "comet",  "frost",  "harbor", "lotus",  "nectar", "quill"};
constexpr const char* kKvIntros[] = {"Here are some records.", "Read the following table carefully.",
                                     "Below is a list of entries.", "Please study these records.",
                                     "This is a small database."};

// List vocabulary.
constexpr const char* kFruits[] = {"apple", "banana", "cherry", "date",  "fig",    "grape", "kiwi", "lemon",
                                   "lime",  "mango",  "melon",  "olive", "orange", "peach", "pear", "plum"};
constexpr const char* kListAnimals[] = {"ant", "bear", "camel", "deer", "eagle", "frog", "goose", "hare",
                                        "ibis", "jackal", "koala", "lion", "mole", "newt", "otter", "panda"};
constexpr const char* kColors[] = {"red", "blue", "green", "yellow", "purple", "orange", "black",
                                   "white", "pink", "brown", "gray", "gold", "silver", "teal"};

std::string Join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += items[i];
  }
  return out;
}

struct Span {
  int lo, hi;
};
// The knob's range at a difficulty level: thirds of [lo, max] (1: first quarter,
// 2: up to the half, 3: the upper half).
Span LevelSpan(int level, int lo, int max_value) {
  max_value = std::max(max_value, lo);
  const int d = max_value - lo;
  if (level <= 1) return {lo, lo + d / 4};
  if (level == 2) return {lo + d / 4, lo + d / 2};
  return {lo + d / 2, max_value};
}
int Draw(Rng& rng, Span s) { return rng.Range(s.lo, std::max(s.lo, s.hi)); }

class Builder {
 public:
  Builder(Rng& rng, bool system_allowed) {
    if (system_allowed && rng.Chance(0.5)) messages_.push_back({"system", rng.Pick(kSystemPrompts)});
  }
  void User(std::string s) { messages_.push_back({"user", std::move(s)}); }
  void Assistant(std::string s) { messages_.push_back({"assistant", std::move(s)}); }
  void Filler(Rng& rng, int n) {
    for (int i = 0; i < n; ++i) {
      User(FillerUserTurn(rng));
      Assistant(FillerAssistantTurn(rng));
    }
  }
  std::vector<ChatMessage> Take() { return std::move(messages_); }

 private:
  std::vector<ChatMessage> messages_;
};

void Finish(Conversation& c, Builder& b, std::string answer, const char* scoring, const std::string& canon) {
  b.Assistant(std::move(answer));
  c.messages = b.Take();
  c.scoring = scoring;
  c.canonical = HashBytes(canon);
}

// ---------------------------------------------------------------- facts
enum FactKind { kPet, kEvent, kRelative, kNumber, kLocation, kNumFactKinds };

struct Fact {
  FactKind kind;
  std::string key;
  std::string v1;  // name, day, city, number, room
  std::string v2;  // event time, relative's name
};

std::string TimeOfDay(Rng& rng) {
  const int h = rng.Range(7, 19);
  const int h12 = h > 12 ? h - 12 : h;
  const char* suffix = h >= 12 ? "pm" : "am";
  return std::to_string(h12) + (rng.Chance(0.3) ? ":30" : "") + suffix;
}

std::string FactValue(Rng& rng, FactKind kind) {
  switch (kind) {
    case kPet: return rng.Pick(kPetNames);
    case kEvent: return rng.Pick(kDays);
    case kRelative: return rng.Pick(kCities);
    case kNumber: return std::to_string(rng.Range(2, 999));
    default: return rng.Pick(kRooms);
  }
}

std::string FactKey(Rng& rng, FactKind kind) {
  switch (kind) {
    case kPet: return rng.Pick(kAnimals);
    case kEvent: return rng.Pick(kEvents);
    case kRelative: return rng.Pick(kRelations);
    case kNumber: return rng.Pick(kNumbered);
    default: return rng.Pick(kObjects);
  }
}

std::string StateFact(Rng& rng, const Fact& f) {
  const std::string& k = f.key;
  switch (f.kind) {
    case kPet: {
      const int t = rng.Range(0, 2);
      if (t == 0) return "My " + k + "'s name is " + f.v1 + ".";
      if (t == 1) return "I have a " + k + " called " + f.v1 + ".";
      return "Our " + k + " is named " + f.v1 + ".";
    }
    case kEvent: {
      const int t = rng.Range(0, 2);
      if (t == 0) return "The " + k + " is on " + f.v1 + " at " + f.v2 + ".";
      if (t == 1) return "I have the " + k + " on " + f.v1 + " at " + f.v2 + ".";
      return "Remember that the " + k + " is on " + f.v1 + " at " + f.v2 + ".";
    }
    case kRelative:
      return rng.Chance(0.5) ? "My " + k + " " + f.v2 + " lives in " + f.v1 + "."
                             : "My " + k + ", " + f.v2 + ", lives in " + f.v1 + ".";
    case kNumber:
      return rng.Chance(0.5) ? "My " + k + " number is " + f.v1 + "." : "I got " + k + " number " + f.v1 + ".";
    default:
      return rng.Chance(0.5) ? "I left my " + k + " in the " + f.v1 + "." : "I put my " + k + " in the " + f.v1 + ".";
  }
}

std::string UpdateFact(const Fact& f) {
  const std::string& k = f.key;
  switch (f.kind) {
    case kPet: return "Actually, my " + k + " is now called " + f.v1 + ".";
    case kEvent: return "The " + k + " has been moved to " + f.v1 + " at " + f.v2 + ".";
    case kRelative: return "My " + k + " " + f.v2 + " just moved to " + f.v1 + ".";
    case kNumber: return "My " + k + " number changed to " + f.v1 + ".";
    default: return "I moved my " + k + " to the " + f.v1 + ".";
  }
}

Conversation Facts(Rng& rng, int level, const DataOptions& o) {
  Conversation c;
  const int n_distractors = Draw(rng, LevelSpan(level, 0, o.facts_max_distractors));
  const int n_filler = Draw(rng, LevelSpan(level, 0, o.facts_max_filler));
  const bool with_update = level >= 3 ? rng.Chance(0.5) : (level == 2 && rng.Chance(0.2));

  std::vector<Fact> facts;
  std::set<std::string> used_keys;
  std::set<std::string> used_people;
  const FactKind target_kind = static_cast<FactKind>(rng.Below(kNumFactKinds));
  for (int i = 0; i <= n_distractors; ++i) {
    FactKind kind = i == 0 || rng.Chance(0.5) ? target_kind : static_cast<FactKind>(rng.Below(kNumFactKinds));
    std::string key;
    for (int attempt = 0; attempt < 20 && (key.empty() || used_keys.count(key)); ++attempt) key = FactKey(rng, kind);
    if (used_keys.count(key)) continue;  // vocabulary of this kind exhausted
    used_keys.insert(key);
    Fact f{kind, key, FactValue(rng, kind), ""};
    if (kind == kEvent) f.v2 = TimeOfDay(rng);
    if (kind == kRelative) {
      do f.v2 = rng.Pick(kPeople);
      while (used_people.count(f.v2));
      used_people.insert(f.v2);
    }
    facts.push_back(f);
  }
  // facts[0] is the one asked about. An update changes the target's value (or
  // a distractor's, so that updates alone do not give the answer away).
  std::vector<Fact> updates;
  if (with_update) {
    const size_t iu = rng.Chance(0.65) || facts.size() == 1 ? 0 : 1 + rng.Below(facts.size() - 1);
    Fact u = facts[iu];
    for (int attempt = 0; attempt < 20 && u.v1 == facts[iu].v1; ++attempt) u.v1 = FactValue(rng, u.kind);
    if (u.kind == kEvent) u.v2 = TimeOfDay(rng);
    updates.push_back(u);
  }

  Builder b(rng, true);
  // Statement turns of one or two facts, in random order, with filler turns
  // spread between them and after them.
  std::vector<int> order(facts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  rng.Shuffle(order);
  std::vector<std::string> turns;
  for (size_t i = 0; i < order.size();) {
    std::string t = StateFact(rng, facts[order[i++]]);
    if (i < order.size() && rng.Chance(0.4)) t += " " + StateFact(rng, facts[order[i++]]);
    turns.push_back(std::move(t));
  }
  // Filler slots: after each statement turn (the last statement's slot holds
  // at least half of them so the distance to the question grows with the knob).
  std::vector<int> filler_after(turns.size(), 0);
  for (int i = 0; i < n_filler; ++i) filler_after[rng.Below(filler_after.size())]++;
  for (size_t i = 0; i < turns.size(); ++i) {
    if (i == 0 && rng.Chance(0.3)) turns[i] = "Here is something to remember. " + turns[i];
    b.User(turns[i]);
    b.Assistant(rng.Pick(kAcks));
    b.Filler(rng, filler_after[i]);
  }
  for (const Fact& u : updates) {
    b.User(UpdateFact(u));
    b.Assistant(rng.Pick(kAcks));
    if (level >= 3) b.Filler(rng, rng.Range(0, 1));
  }

  Fact target = facts[0];
  if (!updates.empty() && updates[0].key == target.key) target = updates[0];
  std::string question;
  std::string answer;
  const char* scoring = "exact_ci";
  const std::string& k = target.key;
  std::string qtype;
  switch (target.kind) {
    case kPet: {
      const int t = rng.Range(0, 2);
      question = t == 0 ? "What is my " + k + "'s name?"
                        : (t == 1 ? "What is the name of my " + k + "?" : "What did I say my " + k + " is called?");
      answer = target.v1;
      qtype = "name";
      break;
    }
    case kEvent:
      if (rng.Chance(0.5)) {
        question = rng.Chance(0.5) ? "What day is the " + k + "?" : "On which day is the " + k + "?";
        answer = target.v1;
        qtype = "day";
      } else {
        question = rng.Chance(0.5) ? "What time is the " + k + "?" : "At what time is the " + k + "?";
        answer = target.v2;
        qtype = "time";
      }
      break;
    case kRelative: {
      const int t = rng.Range(0, 3);
      if (t == 3) {
        question = "What is the name of my " + k + "?";
        answer = target.v2;
        qtype = "name";
      } else {
        question = t == 0 ? "Where does my " + k + " live?"
                          : (t == 1 ? "Which city does my " + k + " live in?" : "In which city does " + target.v2 + " live?");
        answer = target.v1;
        qtype = "city";
      }
      break;
    }
    case kNumber:
      question = rng.Chance(0.5) ? "What is my " + k + " number?" : "Which " + k + " number did I get?";
      answer = target.v1;
      scoring = "numeric";
      qtype = "number";
      break;
    default:
      question = rng.Chance(0.5) ? "Where did I leave my " + k + "?" : "Where is my " + k + "?";
      answer = target.v1;
      qtype = "place";
      break;
  }
  if (rng.Chance(0.2)) question = "One more thing. " + question;
  b.User(question);

  std::vector<std::string> canon_facts;
  for (const Fact& f : facts) canon_facts.push_back(std::to_string(f.kind) + ":" + f.key + "=" + f.v1 + "/" + f.v2);
  std::sort(canon_facts.begin(), canon_facts.end());
  std::string canon = "facts|" + Join(canon_facts, ";");
  for (const Fact& u : updates) canon += "|u:" + u.key + "=" + u.v1 + "/" + u.v2;
  canon += "|q:" + qtype + ":" + k;
  Finish(c, b, answer, scoring, canon);
  return c;
}

// ---------------------------------------------------------------- key-value
std::string RandomKey(Rng& rng) {
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string k(4, 'a');
  for (char& ch : k) ch = kAlnum[rng.Below(36)];
  return k;
}

Conversation KeyValue(Rng& rng, int level, const DataOptions& o) {
  Conversation c;
  // Document size grows geometrically with the level: ~150 B .. kv_max_bytes.
  const double lo = 150.0;
  const double hi = std::max(lo, static_cast<double>(o.kv_max_bytes));
  const double r = std::cbrt(hi / lo);
  const double span_lo = lo * std::pow(r, level - 1);
  const double span_hi = lo * std::pow(r, level);
  const int target_bytes = static_cast<int>(span_lo + (span_hi - span_lo) * rng.Unit());
  const bool reverse = rng.Chance(0.2);
  const bool numeric_values = reverse || rng.Chance(0.3);
  const bool prose_lines = level >= 2 && rng.Chance(0.5);
  const bool near_misses = level >= 3 && rng.Chance(0.6);

  struct Record {
    std::string key, value;
    std::string trailer;  // a prose line printed after the record, or empty
  };
  std::vector<Record> records;
  std::set<std::string> keys;
  std::set<std::string> values;
  auto new_value = [&] {
    std::string v;
    do v = numeric_values ? std::to_string(rng.Range(100, 99999)) : std::string(rng.Pick(kValueWords));
    while (reverse && values.count(v));  // reverse lookup needs unique values
    values.insert(v);
    return v;
  };
  std::string target_key = RandomKey(rng);
  keys.insert(target_key);
  // Every line counts towards the document size, prose lines included.
  auto add_record = [&](const std::string& k) {
    Record rec{k, new_value(), ""};
    if (prose_lines && rng.Chance(0.2)) rec.trailer = GrammarSentence(rng);
    const int n = static_cast<int>(k.size() + rec.value.size() + 7 + (rec.trailer.empty() ? 0 : rec.trailer.size() + 1));
    records.push_back(std::move(rec));
    return n;
  };
  int bytes = add_record(target_key);
  while (bytes < target_bytes) {
    std::string k;
    if (near_misses && rng.Chance(0.15)) {
      k = target_key;
      static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
      k[rng.Below(4)] = kAlnum[rng.Below(36)];
    } else {
      k = RandomKey(rng);
    }
    if (keys.count(k)) continue;
    keys.insert(k);
    bytes += add_record(k);
  }
  rng.Shuffle(records);

  std::string doc = rng.Pick(kKvIntros);
  std::string target_value;
  for (const Record& rec : records) {
    doc += "\nkey-" + rec.key + ": " + rec.value;
    if (!rec.trailer.empty()) doc += "\n" + rec.trailer;
    if (rec.key == target_key) target_value = rec.value;
  }

  std::string question;
  std::string answer;
  if (reverse) {
    question = rng.Chance(0.5) ? "Which key has the value " + target_value + "?"
                               : "Which key stores the value " + target_value + "?";
    answer = "key-" + target_key;
  } else {
    const int t = rng.Range(0, 3);
    const std::string kk = "key-" + target_key;
    if (t == 0) question = "What is the value of " + kk + "?";
    if (t == 1) question = "What value does " + kk + " have?";
    if (t == 2) question = "Look up " + kk + " and tell me its value.";
    if (t == 3) question = "Which value is stored under " + kk + "?";
    answer = target_value;
  }

  Builder b(rng, true);
  if (rng.Chance(0.5)) {
    b.User(doc + "\n\n" + question);
  } else {
    b.User(doc);
    b.Assistant(rng.Chance(0.5) ? "I have read the records." : "Okay, I have them.");
    b.Filler(rng, level >= 3 ? rng.Range(0, 2) : 0);
    b.User(question);
  }
  std::string canon = std::string("kv|") + (reverse ? "r" : "f") + "|" + target_key;
  for (const Record& rec : records) canon += ";" + rec.key + "=" + rec.value;
  Finish(c, b, answer, "exact", canon);
  return c;
}

// ---------------------------------------------------------------- arithmetic
Conversation Arith(Rng& rng, int level, const DataOptions& o) {
  Conversation c;
  const int n_steps = Draw(rng, LevelSpan(level, 1, o.arith_max_steps));
  const int max_operand = level >= 3 ? 99 : (level == 2 ? 50 : 20);
  const int variant = rng.Below(100) < 45 ? 0 : (rng.Below(100) < 55 ? 1 : 2);
  long total = rng.Range(1, level == 1 ? 20 : 50);
  const long start = total;
  std::string canon = "arith|" + std::to_string(variant) + "|" + std::to_string(start);
  struct Op {
    char op;
    long n;
  };
  std::vector<Op> ops;
  for (int i = 0; i < n_steps; ++i) {
    Op op{'+', 0};
    if (variant == 0 && level >= 3 && total <= 300 && rng.Chance(0.15)) {
      op = {'*', rng.Range(2, 3)};
      total *= op.n;
    } else if (total > 0 && rng.Chance(0.45)) {
      op = {'-', rng.Range(1, static_cast<int>(std::min<long>(total, max_operand)))};
      total -= op.n;
    } else {
      op = {'+', rng.Range(1, max_operand)};
      total += op.n;
    }
    ops.push_back(op);
    canon += std::string(";") + op.op + std::to_string(op.n);
  }

  Builder b(rng, true);
  const int n_filler = level >= 3 ? rng.Range(0, 2) : 0;
  std::vector<int> filler_after(ops.size() + 1, 0);
  for (int i = 0; i < n_filler; ++i) filler_after[rng.Below(filler_after.size())]++;
  std::string question;
  if (variant == 1) {
    const bool words = rng.Chance(0.4);
    std::string expr = std::to_string(start);
    for (const Op& op : ops) {
      expr += words ? (op.op == '+' ? " plus " : " minus ") : (op.op == '+' ? " + " : " - ");
      expr += std::to_string(op.n);
    }
    question = words ? "What is " + expr + "?" : (rng.Chance(0.5) ? "Compute " : "Calculate ") + expr + ".";
  } else {
    const bool show_totals = level == 1 || (level == 2 && rng.Chance(0.5)) || rng.Chance(0.1);
    long running = start;
    const std::string item = rng.Pick({std::string("apples"), std::string("coins"), std::string("stamps"),
                                       std::string("marbles"), std::string("pencils"), std::string("shells"),
                                       std::string("stickers"), std::string("tickets"), std::string("cards")});
    if (variant == 0) {
      const int t = rng.Range(0, 2);
      const std::string s = std::to_string(start);
      b.User(t == 0 ? "Start with " + s + "." : (t == 1 ? "Let's begin with " + s + "." : "Take the number " + s + "."));
    } else {
      b.User("I have " + std::to_string(start) + " " + item + ".");
    }
    b.Assistant(show_totals ? "Okay, " + std::to_string(start) + "." : "Okay.");
    b.Filler(rng, filler_after[0]);
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const std::string n = std::to_string(op.n);
      if (variant == 0) {
        if (op.op == '+') b.User(rng.Pick({"Add " + n + ".", "Now add " + n + ".", "Plus " + n + "."}));
        if (op.op == '-') b.User(rng.Pick({"Subtract " + n + ".", "Now subtract " + n + ".", "Take away " + n + "."}));
        if (op.op == '*') {
          b.User(op.n == 2 && rng.Chance(0.5) ? std::string("Double it.")
                                              : rng.Pick({"Multiply by " + n + ".", "Now multiply it by " + n + "."}));
        }
        running = op.op == '+' ? running + op.n : (op.op == '-' ? running - op.n : running * op.n);
      } else {
        if (op.op == '+') b.User(rng.Pick({"I buy " + n + " more.", "I find " + n + " more.", "Someone gives me " + n + " more."}));
        if (op.op == '-') b.User(rng.Pick({"I give away " + n + ".", "I lose " + n + ".", "I sell " + n + "."}));
        running = op.op == '+' ? running + op.n : running - op.n;
      }
      if (show_totals) {
        b.Assistant(rng.Chance(0.5) ? "That makes " + std::to_string(running) + "." : "Now it is " + std::to_string(running) + ".");
      } else {
        b.Assistant(rng.Pick({std::string("Done."), std::string("Okay."), std::string("Got it.")}));
      }
      b.Filler(rng, filler_after[i + 1]);
    }
    if (variant == 0) {
      question = rng.Pick({std::string("What is the total?"), std::string("What number do we have now?"),
                           std::string("What is the result?"), std::string("What is the running total?")});
    } else {
      question = rng.Chance(0.5) ? "How many " + item + " do I have now?" : "How many " + item + " are left?";
    }
  }
  b.User(question);
  Finish(c, b, std::to_string(total), "numeric", canon);
  return c;
}

// ---------------------------------------------------------------- lists
Conversation Lists(Rng& rng, int level, const DataOptions& o) {
  Conversation c;
  const int n = Draw(rng, LevelSpan(level, 3, std::max(3, o.list_max_len)));
  const int pool = rng.Range(0, 3);  // fruits, animals, colors, numbers
  const bool numbers = pool == 3;
  auto draw_item = [&]() -> std::string {
    if (pool == 0) return rng.Pick(kFruits);
    if (pool == 1) return rng.Pick(kListAnimals);
    if (pool == 2) return rng.Pick(kColors);
    return std::to_string(rng.Range(1, 99));
  };
  const size_t pool_size = pool == 0 ? std::size(kFruits) : (pool == 1 ? std::size(kListAnimals) : (pool == 2 ? std::size(kColors) : 99));
  enum Op { kSort, kReverse, kCount, kKth, kLast, kOccurrences, kMax, kMin };
  std::vector<Op> op_choices = {kSort, kReverse, kCount, kKth, kKth, kLast, kOccurrences};
  if (numbers) op_choices.insert(op_choices.end(), {kMax, kMin});
  const Op op = rng.Pick(op_choices);

  std::vector<std::string> items;
  if (op == kOccurrences) {
    std::vector<std::string> distinct;
    const int n_distinct = rng.Range(2, std::max(2, std::min(n - 1, 5)));
    while (static_cast<int>(distinct.size()) < n_distinct) {
      std::string x = draw_item();
      if (std::find(distinct.begin(), distinct.end(), x) == distinct.end()) distinct.push_back(x);
    }
    for (int i = 0; i < n; ++i) items.push_back(rng.Pick(distinct));
  } else {
    const size_t want = std::min<size_t>(static_cast<size_t>(n), pool_size - 2);
    while (items.size() < want) {
      std::string x = draw_item();
      if (std::find(items.begin(), items.end(), x) == items.end()) items.push_back(x);
    }
  }
  std::string canon = "lists|" + Join(items, ",");

  Builder b(rng, true);
  const int t = rng.Range(0, 2);
  const std::string list_sentence =
      std::string(t == 0 ? "Here is a list: " : (t == 1 ? "Remember this list: " : "My list is: ")) + Join(items, ", ") + ".";
  const bool separate = level >= 2 || rng.Chance(0.3);
  const bool modify = level >= 3 && op != kOccurrences && rng.Chance(0.5);
  if (separate) {
    b.User(list_sentence);
    b.Assistant(rng.Pick({std::string("Okay."), std::string("Got it."), std::string("I have the list.")}));
    b.Filler(rng, level == 2 ? rng.Range(0, 1) : (level >= 3 ? rng.Range(1, 3) : 0));
    if (modify) {
      const int n_mods = rng.Range(1, 2);
      for (int m = 0; m < n_mods; ++m) {
        if (rng.Chance(0.5) && items.size() > 2) {
          const std::string x = items[rng.Below(items.size())];
          items.erase(std::find(items.begin(), items.end(), x));
          b.User("Remove " + x + " from the list.");
          canon += "|-" + x;
        } else {
          std::string x;
          do x = draw_item();
          while (std::find(items.begin(), items.end(), x) != items.end());
          items.push_back(x);
          b.User("Add " + x + " to the end of the list.");
          canon += "|+" + x;
        }
        b.Assistant("Done.");
      }
    }
  }

  std::string question;
  std::string answer;
  const char* scoring = "exact";
  switch (op) {
    case kSort: {
      std::vector<std::string> sorted = items;
      if (numbers) {
        std::sort(sorted.begin(), sorted.end(), [](const std::string& a, const std::string& b) { return std::stoi(a) < std::stoi(b); });
        question = rng.Chance(0.5) ? "Sort the list from smallest to largest." : "Sort the numbers in ascending order.";
      } else {
        std::sort(sorted.begin(), sorted.end());
        question = rng.Chance(0.5) ? "Sort the list alphabetically." : "Put the list in alphabetical order.";
      }
      answer = Join(sorted, ", ");
      canon += "|sort";
      break;
    }
    case kReverse: {
      std::vector<std::string> rev(items.rbegin(), items.rend());
      question = rng.Chance(0.5) ? "Reverse the list." : "Give me the list in reverse order.";
      answer = Join(rev, ", ");
      canon += "|reverse";
      break;
    }
    case kCount:
      question = rng.Chance(0.5) ? "How many items are in the list?" : "How many items does the list have?";
      answer = std::to_string(items.size());
      scoring = "numeric";
      canon += "|count";
      break;
    case kKth: {
      const int k = static_cast<int>(rng.Below(std::min<size_t>(items.size(), kNumOrdinals)));
      question = rng.Chance(0.5) ? std::string("What is the ") + kOrdinals[k] + " item in the list?"
                                 : std::string("Which item is ") + kOrdinals[k] + " in the list?";
      answer = items[k];
      canon += "|kth" + std::to_string(k);
      break;
    }
    case kLast:
      question = "What is the last item in the list?";
      answer = items.back();
      canon += "|last";
      break;
    case kOccurrences: {
      const std::string x = items[rng.Below(items.size())];
      question = "How many times does " + x + " appear in the list?";
      answer = std::to_string(std::count(items.begin(), items.end(), x));
      scoring = "numeric";
      canon += "|occ" + x;
      break;
    }
    case kMax:
    case kMin: {
      long best = std::stol(items[0]);
      for (const std::string& x : items) best = op == kMax ? std::max(best, std::stol(x)) : std::min(best, std::stol(x));
      question = op == kMax ? "What is the largest number in the list?" : "What is the smallest number in the list?";
      answer = std::to_string(best);
      scoring = "numeric";
      canon += op == kMax ? "|max" : "|min";
      break;
    }
  }
  if (separate) {
    b.User(question);
  } else {
    b.User(list_sentence + " " + question);
  }
  Finish(c, b, answer, scoring, canon);
  return c;
}

// ---------------------------------------------------------------- strings
Conversation Strings(Rng& rng, int level, const DataOptions& o) {
  Conversation c;
  static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  auto random_string = [&](int len) {
    std::string s(static_cast<size_t>(len), 'a');
    for (char& ch : s) ch = kAlnum[rng.Below(rng.Chance(0.8) ? 26 : 36)];
    return s;
  };
  const Span span = LevelSpan(level, 3, std::max(3, o.string_max_len));
  const bool memory = level >= 3 || (level == 2 && rng.Chance(0.7));
  const int n_codes = memory ? (level >= 3 ? rng.Range(2, 3) : 1) : 1;
  std::vector<std::string> labels;
  std::vector<std::string> codes;
  while (static_cast<int>(codes.size()) < n_codes) {
    const std::string label = rng.Pick(kColors);
    if (std::find(labels.begin(), labels.end(), label) != labels.end()) continue;
    labels.push_back(label);
    codes.push_back(random_string(Draw(rng, span)));
  }
  const size_t it = rng.Below(codes.size());
  const std::string& s = codes[it];
  // Operand as written in the question: quoted inline, or a reference.
  const std::string ref = memory ? "the " + labels[it] + " code" : "\"" + s + "\"";

  enum Op { kReverse, kUpper, kRepeat, kReplace, kLength, kCharAt };
  const Op op = static_cast<Op>(rng.Below(6));
  std::string question;
  std::string answer;
  const char* scoring = "exact";
  std::string canon = "strings|";
  for (size_t i = 0; i < codes.size(); ++i) canon += labels[i] + "=" + codes[i] + ";";
  canon += "|t" + std::to_string(it) + "|";
  switch (op) {
    case kReverse:
      question = rng.Chance(0.5) ? "Reverse " + ref + "." : "Write " + ref + " backwards.";
      answer = std::string(s.rbegin(), s.rend());
      canon += "rev";
      break;
    case kUpper:
      question = rng.Chance(0.5) ? "Convert " + ref + " to uppercase." : "Write " + ref + " in capital letters.";
      answer = s;
      for (char& ch : answer) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      canon += "upper";
      break;
    case kRepeat: {
      const int k = s.size() <= 8 ? rng.Range(2, 3) : 2;
      question = rng.Chance(0.5) ? "Repeat " + ref + " " + std::to_string(k) + " times, with no spaces."
                                 : "Write " + ref + " " + std::to_string(k) + " times in a row.";
      for (int i = 0; i < k; ++i) answer += s;
      canon += "rep" + std::to_string(k);
      break;
    }
    case kReplace: {
      const char from = s[rng.Below(s.size())];
      char to = from;
      while (to == from) to = kAlnum[rng.Below(26)];
      question = std::string("Replace every \"") + from + "\" with \"" + to + "\" in " + ref + ".";
      answer = s;
      std::replace(answer.begin(), answer.end(), from, to);
      canon += std::string("repl") + from + to;
      break;
    }
    case kLength:
      question = "How many characters are in " + ref + "?";
      answer = std::to_string(s.size());
      scoring = "numeric";
      canon += "len";
      break;
    case kCharAt: {
      const int k = static_cast<int>(rng.Below(std::min<size_t>(s.size(), kNumOrdinals)));
      question = std::string("What is the ") + kOrdinals[k] + " character of " + ref + "?";
      answer = std::string(1, s[k]);
      canon += "at" + std::to_string(k);
      break;
    }
  }

  Builder b(rng, true);
  if (memory) {
    std::vector<int> order(codes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    rng.Shuffle(order);
    for (int i : order) {
      b.User("The " + labels[i] + " code is \"" + codes[i] + "\".");
      b.Assistant(rng.Pick(kAcks));
      b.Filler(rng, level >= 3 ? rng.Range(0, 2) : rng.Range(0, 1));
    }
  }
  b.User(question);
  Finish(c, b, answer, scoring, canon);
  return c;
}

// ---------------------------------------------------------------- chat
Conversation Chat(Rng& rng) {
  Conversation c;
  Builder b(rng, true);
  if (rng.Chance(0.3)) {
    b.User(rng.Pick({std::string("Write a short paragraph."), std::string("Tell me a little story."),
                     std::string("Write a few sentences about anything you like.")}));
    b.Assistant(GrammarParagraph(rng, 6));
  } else {
    b.Filler(rng, rng.Range(1, 4));
  }
  c.messages = b.Take();
  c.canonical = HashBytes(RenderChatMl(c.messages));
  return c;
}

}  // namespace

const char* TaskName(Task task) {
  switch (task) {
    case Task::kFacts: return "facts";
    case Task::kKv: return "kv";
    case Task::kArith: return "arith";
    case Task::kLists: return "lists";
    case Task::kStrings: return "strings";
    case Task::kChat: return "chat";
    case Task::kProse: return "prose";
  }
  return "?";
}

Conversation GenerateItem(Task task, int difficulty, uint64_t item_seed, const DataOptions& options) {
  Rng rng(item_seed);
  const int level = std::clamp(difficulty, 1, 3);
  Conversation c;
  switch (task) {
    case Task::kFacts: c = Facts(rng, level, options); break;
    case Task::kKv: c = KeyValue(rng, level, options); break;
    case Task::kArith: c = Arith(rng, level, options); break;
    case Task::kLists: c = Lists(rng, level, options); break;
    case Task::kStrings: c = Strings(rng, level, options); break;
    case Task::kChat: c = Chat(rng); break;
    case Task::kProse:
      // Real prose comes from files, never from a seed; a caller asking for it is a bug.
      std::fprintf(stderr, "GenerateItem: prose items are built from files, not generated\n");
      std::abort();
  }
  c.task = task;
  c.difficulty = task == Task::kChat ? 0 : level;
  return c;
}

}  // namespace kvl::datagen
