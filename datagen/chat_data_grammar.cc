#include "datagen/chat_data_grammar.h"

#include <cctype>
#include <string>

namespace kvl::datagen {
namespace {

struct Noun {
  const char* sg;
  const char* pl;
};
struct Verb {
  const char* base;
  const char* s;     // third person singular
  const char* past;
};

constexpr Noun kPeople[] = {
    {"farmer", "farmers"},     {"teacher", "teachers"},   {"baker", "bakers"},
    {"sailor", "sailors"},     {"painter", "painters"},   {"doctor", "doctors"},
    {"student", "students"},   {"writer", "writers"},     {"driver", "drivers"},
    {"gardener", "gardeners"}, {"pilot", "pilots"},       {"singer", "singers"},
    {"neighbour", "neighbours"}, {"traveller", "travellers"}, {"child", "children"},
    {"merchant", "merchants"}, {"carpenter", "carpenters"}, {"nurse", "nurses"},
    {"fisherman", "fishermen"}, {"engineer", "engineers"}, {"poet", "poets"},
    {"musician", "musicians"}, {"shepherd", "shepherds"}, {"librarian", "librarians"},
    {"cook", "cooks"},         {"guard", "guards"},       {"stranger", "strangers"},
    {"scientist", "scientists"},
};
constexpr Noun kThings[] = {
    {"boat", "boats"},       {"basket", "baskets"},   {"letter", "letters"},
    {"lamp", "lamps"},       {"map", "maps"},         {"chair", "chairs"},
    {"window", "windows"},   {"bridge", "bridges"},   {"song", "songs"},
    {"story", "stories"},    {"garden", "gardens"},   {"bicycle", "bicycles"},
    {"kettle", "kettles"},   {"coat", "coats"},       {"cart", "carts"},
    {"drum", "drums"},       {"ladder", "ladders"},   {"blanket", "blankets"},
    {"mirror", "mirrors"},   {"bell", "bells"},       {"candle", "candles"},
    {"picture", "pictures"}, {"rope", "ropes"},       {"box", "boxes"},
    {"cup", "cups"},         {"hat", "hats"},         {"book", "books"},
    {"tree", "trees"},       {"flower", "flowers"},   {"stone", "stones"},
    {"wall", "walls"},       {"fence", "fences"},     {"road", "roads"},
    {"cloud", "clouds"},     {"river", "rivers"},     {"hill", "hills"},
    {"apple", "apples"},     {"loaf", "loaves"},      {"pot", "pots"},
    {"clock", "clocks"},     {"train", "trains"},     {"horse", "horses"},
    {"bird", "birds"},       {"fox", "foxes"},        {"owl", "owls"},
    {"goat", "goats"},       {"sheep", "sheep"},      {"fish", "fish"},
};
constexpr Verb kTransitive[] = {
    {"carry", "carries", "carried"}, {"paint", "paints", "painted"},
    {"find", "finds", "found"},      {"watch", "watches", "watched"},
    {"build", "builds", "built"},    {"open", "opens", "opened"},
    {"mend", "mends", "mended"},     {"follow", "follows", "followed"},
    {"clean", "cleans", "cleaned"},  {"sell", "sells", "sold"},
    {"borrow", "borrows", "borrowed"}, {"draw", "draws", "drew"},
    {"push", "pushes", "pushed"},    {"lift", "lifts", "lifted"},
    {"count", "counts", "counted"},  {"visit", "visits", "visited"},
    {"admire", "admires", "admired"}, {"hide", "hides", "hid"},
    {"describe", "describes", "described"}, {"forget", "forgets", "forgot"},
    {"bring", "brings", "brought"},  {"share", "shares", "shared"},
    {"notice", "notices", "noticed"}, {"wash", "washes", "washed"},
    {"study", "studies", "studied"}, {"remember", "remembers", "remembered"},
    {"pack", "packs", "packed"},     {"fix", "fixes", "fixed"},
};
constexpr Verb kIntransitive[] = {
    {"walk", "walks", "walked"},   {"wait", "waits", "waited"},
    {"sing", "sings", "sang"},     {"rest", "rests", "rested"},
    {"travel", "travels", "travelled"}, {"work", "works", "worked"},
    {"laugh", "laughs", "laughed"}, {"sleep", "sleeps", "slept"},
    {"run", "runs", "ran"},        {"swim", "swims", "swam"},
    {"dance", "dances", "danced"}, {"listen", "listens", "listened"},
    {"wander", "wanders", "wandered"}, {"hurry", "hurries", "hurried"},
    {"stay", "stays", "stayed"},   {"read", "reads", "read"},
    {"cook", "cooks", "cooked"},   {"arrive", "arrives", "arrived"},
};
constexpr const char* kAdjectives[] = {
    "old",     "young",   "quiet",   "tired",   "happy",   "small",   "large",   "bright",
    "dark",    "heavy",   "light",   "warm",    "cold",    "red",     "blue",    "green",
    "yellow",  "wooden",  "careful", "clever",  "gentle",  "brave",   "patient", "curious",
    "busy",    "lazy",    "proud",   "shy",     "strange", "simple",  "broken",  "shiny",
    "narrow",  "wide",    "tall",    "short",   "soft",    "rough",   "quick",   "slow",
    "cheerful", "serious", "famous",  "ordinary", "little",  "empty",   "full",    "ancient",
    "modern",  "noisy",   "silent",  "golden",  "silver",  "fresh",   "dusty",   "friendly",
};
constexpr const char* kAdverbs[] = {
    "slowly",  "quickly",  "quietly",  "carefully", "happily", "often",    "rarely",
    "gladly",  "calmly",   "suddenly", "patiently", "together", "alone",   "again",
    "early",   "late",     "gently",   "proudly",  "eagerly",  "sometimes", "usually",
};
constexpr const char* kPlaces[] = {
    "the market",   "the river",     "the old bridge", "the village",  "the harbour",
    "the station",  "the forest",    "the mountain",   "the library",  "the square",
    "the meadow",   "the workshop",  "the bakery",     "the school",   "the lighthouse",
    "the orchard",  "the valley",    "the shore",      "the castle",   "the farm",
    "the museum",   "the park",      "the tower",      "the lake",     "the town hall",
    "the hospital", "the theatre",   "the island",     "the church",   "the mill",
};
constexpr const char* kPrepositions[] = {"near", "behind", "beside", "across", "around",
                                         "past", "towards", "inside", "outside", "above"};
constexpr const char* kTimes[] = {
    "in the morning",  "in the evening",  "at night",       "after lunch",     "before dinner",
    "every day",       "on weekends",     "in the spring",  "in the summer",   "in the autumn",
    "in the winter",   "at dawn",         "at noon",        "after the rain",  "before sunrise",
    "all afternoon",   "once a week",     "during the storm", "after school",  "at sunset",
};
constexpr const char* kNames[] = {
    "Anna",  "Bruno", "Clara", "Dmitri", "Edith", "Felix",  "Greta", "Henrik", "Ida",
    "Jakob", "Klara", "Lukas", "Mira",   "Nils",  "Olga",   "Pavel", "Rita",   "Stefan",
    "Thea",  "Viktor", "Wanda", "Xaver", "Yara",  "Zelda",  "Arlo",  "Bea",    "Cyrus",
    "Dora",  "Emil",  "Flora",
};
constexpr const char* kTopics[] = {
    "the weather",  "old maps",      "bread",        "boats",       "music",
    "gardens",      "trains",        "rivers",       "birds",       "winter",
    "the sea",      "mountains",     "small towns",  "painting",    "clocks",
    "bridges",      "the harvest",   "stories",      "libraries",   "candles",
};

std::string Capitalize(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

std::string Article(const std::string& word) {
  const char c = word.empty() ? 'x' : word[0];
  return (c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u') ? "an" : "a";
}

// A singular noun phrase: "the quiet baker", "an old boat", "Greta".
std::string NounPhraseSg(Rng& rng, bool person) {
  if (person && rng.Chance(0.25)) return rng.Pick(kNames);
  const std::string noun = person ? rng.Pick(kPeople).sg : rng.Pick(kThings).sg;
  std::string adj = rng.Chance(0.6) ? std::string(rng.Pick(kAdjectives)) + " " : "";
  const int det = rng.Range(0, 3);
  if (det == 0) return Article(adj.empty() ? noun : adj) + " " + adj + noun;
  if (det == 1) return "that " + adj + noun;
  return "the " + adj + noun;
}

std::string NounPhrasePl(Rng& rng, bool person) {
  const std::string noun = person ? rng.Pick(kPeople).pl : rng.Pick(kThings).pl;
  constexpr const char* kDets[] = {"the", "some", "two", "three", "many", "a few", "those"};
  std::string adj = rng.Chance(0.5) ? std::string(rng.Pick(kAdjectives)) + " " : "";
  return std::string(rng.Pick(kDets)) + " " + adj + noun;
}

std::string Clause(Rng& rng) {
  const bool past = rng.Chance(0.4);
  const bool plural = rng.Chance(0.3);
  std::string subj = plural ? NounPhrasePl(rng, true) : NounPhraseSg(rng, true);
  std::string out = subj + " ";
  if (rng.Chance(0.6)) {
    const Verb& v = rng.Pick(kTransitive);
    out += past ? v.past : (plural ? v.base : v.s);
    out += " " + (rng.Chance(0.7) ? NounPhraseSg(rng, false) : NounPhrasePl(rng, false));
  } else {
    const Verb& v = rng.Pick(kIntransitive);
    out += past ? v.past : (plural ? v.base : v.s);
  }
  const int tail = rng.Range(0, 4);
  if (tail == 0) out += std::string(" ") + rng.Pick(kPrepositions) + " " + rng.Pick(kPlaces);
  if (tail == 1) out += std::string(" ") + rng.Pick(kTimes);
  if (tail == 2) out += std::string(" ") + rng.Pick(kAdverbs);
  if (tail == 3) {
    out += std::string(" ") + rng.Pick(kPrepositions) + " " + rng.Pick(kPlaces) + " " + rng.Pick(kTimes);
  }
  return out;
}

}  // namespace

std::string GrammarSentence(Rng& rng) {
  switch (rng.Range(0, 7)) {
    case 0:
      return Capitalize(std::string("when ") + Clause(rng) + ", " + Clause(rng)) + ".";
    case 1:
      return Capitalize(std::string(rng.Pick(kNames)) + " says that " + Clause(rng)) + ".";
    case 2:
      return Capitalize("there is " + NounPhraseSg(rng, false) + " " + rng.Pick(kPrepositions) + " " +
                        rng.Pick(kPlaces)) +
             ".";
    case 3:
      return Capitalize(Clause(rng) + " because " + Clause(rng)) + ".";
    case 4:
      return Capitalize(Clause(rng) + ", and " + Clause(rng)) + ".";
    case 5:
      return Capitalize(std::string(rng.Pick(kTimes)) + ", " + Clause(rng)) + ".";
    default:
      return Capitalize(Clause(rng)) + ".";
  }
}

std::string GrammarQuestion(Rng& rng) {
  const Verb& vt = rng.Pick(kTransitive);
  const Verb& vi = rng.Pick(kIntransitive);
  switch (rng.Range(0, 5)) {
    case 0:
      return "Why does " + NounPhraseSg(rng, true) + " " + vt.base + " " + NounPhraseSg(rng, false) + "?";
    case 1:
      return std::string("Where do the ") + rng.Pick(kPeople).pl + " " + vi.base + " " + rng.Pick(kTimes) + "?";
    case 2:
      return "Have you ever seen " + NounPhraseSg(rng, false) + " " + rng.Pick(kPrepositions) + " " +
             rng.Pick(kPlaces) + "?";
    case 3:
      return std::string("What do you think about ") + rng.Pick(kTopics) + "?";
    case 4:
      return "Did " + NounPhraseSg(rng, true) + " really " + vi.base + " " + rng.Pick(kTimes) + "?";
    default:
      return std::string("Can you tell me something about ") + rng.Pick(kTopics) + "?";
  }
}

std::string GrammarParagraph(Rng& rng, int n_max) {
  const int n = rng.Range(2, n_max < 2 ? 2 : n_max);
  std::string out;
  for (int i = 0; i < n; ++i) {
    if (i > 0) out += ' ';
    out += GrammarSentence(rng);
  }
  return out;
}

std::string FillerUserTurn(Rng& rng) {
  switch (rng.Range(0, 4)) {
    case 0:
      return GrammarQuestion(rng);
    case 1:
      return "By the way, " + Clause(rng) + ".";
    case 2:
      return GrammarSentence(rng) + " " + GrammarQuestion(rng);
    case 3:
      return std::string("Tell me a short story about ") + rng.Pick(kTopics) + ".";
    default:
      return GrammarSentence(rng);
  }
}

std::string FillerAssistantTurn(Rng& rng) {
  constexpr const char* kOpeners[] = {"", "", "", "Sure. ", "Well, ", "Good question. ", "Here is one. "};
  return std::string(rng.Pick(kOpeners)) + GrammarParagraph(rng, 3);
}

}  // namespace kvl::datagen
