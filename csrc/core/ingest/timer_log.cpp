#include "core/ingest/timer_log.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <utility>

namespace relax_straggler::core::ingest {
namespace {

constexpr std::int32_t kMaxRank = 1 << 20;  // larger rank numbers are taken as corruption
// The longest time a timer may print, ms (~3,000 years; readers/base.py MAX_TIME_S): beyond it
// no clock measured it, and sums of such values overflow to inf.
constexpr double kMaxMs = 1e14;

std::string_view trim_left(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

std::string_view trim(std::string_view s) {
  s = trim_left(s);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Skips a launcher prefix: "[anything]:" (torchrun --tee) or "<digits>: " (srun -l).
std::string_view strip_launcher_prefix(std::string_view s) {
  if (!s.empty() && s[0] == '[') {
    const std::size_t end = s.find("]:");
    if (end != std::string_view::npos && end < 64) return s.substr(end + 2);
  }
  std::size_t i = 0;
  while (i < s.size() && i < 8 && s[i] >= '0' && s[i] <= '9') ++i;
  if (i > 0 && i + 1 < s.size() && s[i] == ':' && s[i + 1] == ' ') return s.substr(i + 2);
  return s;
}

bool parse_double(std::string_view s, double& out) {
  s = trim(s);
  if (s.empty()) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool parse_int(std::string_view s, std::int64_t& out) {
  s = trim(s);
  if (s.empty()) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// "name ........: rest" (Megatron pads the name with dots): name and rest, or false.
bool split_dotted(std::string_view t, std::string_view& name, std::string_view& rest) {
  const std::size_t colon = t.find(':');
  if (colon == std::string_view::npos) return false;
  std::string_view head = trim(t.substr(0, colon));
  if (head.size() < 2 || head.back() != '.') return false;
  while (!head.empty() && (head.back() == '.' || head.back() == ' ')) head.remove_suffix(1);
  if (head.empty()) return false;
  name = head;
  rest = trim(t.substr(colon + 1));
  return true;
}

bool usable_ms(double x) { return std::isfinite(x) && x >= 0.0 && x <= kMaxMs; }

// Timer and argument names: letters, digits and _ . / - (so a name is always valid text).
bool is_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '/' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Input text quoted in a message: printable ASCII kept, other bytes as \xNN, at most 80.
std::string quoted(std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < 80; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out + (s.size() > 80 ? "...'" : "'");
}

}  // namespace

void TimerLogScanner::issue(std::string message, std::int64_t rejected) {
  rejected_ += rejected;
  issues_.push_back({line_, std::move(message), rejected});
}

void TimerLogScanner::feed(const char* data, std::size_t size) {
  std::size_t start = 0;
  if (!pending_.empty()) {
    const void* nl = std::memchr(data, '\n', size);
    if (nl == nullptr) {
      pending_.append(data, size);
      return;
    }
    const std::size_t end = static_cast<std::size_t>(static_cast<const char*>(nl) - data);
    pending_.append(data, end);
    parse_line(pending_);
    pending_.clear();
    start = end + 1;
  }
  while (start < size) {
    const void* nl = std::memchr(data + start, '\n', size - start);
    if (nl == nullptr) {
      pending_.assign(data + start, size - start);
      return;
    }
    const std::size_t end = static_cast<std::size_t>(static_cast<const char*>(nl) - data);
    parse_line(std::string_view(data + start, end - start));
    start = end + 1;
  }
}

void TimerLogScanner::finish() {
  if (!pending_.empty()) {
    parse_line(pending_);
    pending_.clear();
    issue("the last line has no newline: the file may be truncated");
  }
  close_block();
}

std::vector<TimerBlock> TimerLogScanner::take_blocks() { return std::exchange(done_, {}); }
std::vector<LineIssue> TimerLogScanner::take_issues() { return std::exchange(issues_, {}); }

void TimerLogScanner::close_block() {
  if (!in_block_) return;
  in_block_ = false;
  if (block_.timers.empty()) {
    issues_.push_back({block_.line, "timer block has no timers"});
    return;
  }
  done_.push_back(std::move(block_));
  block_ = TimerBlock{};
}

// One line inside an open block; false when the line is not part of the block.
bool TimerLogScanner::parse_block_line(std::string_view text) {
  const std::string_view t = trim(text);
  if (t.empty()) return false;
  if (block_.form != BlockForm::kAllRanks) {
    std::string_view name, rest;
    if (!split_dotted(t, name, rest) || !is_name(name)) return false;
    TimerValues v;
    v.name = std::string(name);
    v.line = line_;
    bool ok = false;
    if (block_.form == BlockForm::kMax) {
      ok = parse_double(rest, v.max_ms) && usable_ms(v.max_ms);
    } else if (rest.size() >= 2 && rest.front() == '(' && rest.back() == ')') {
      const std::string_view inner = rest.substr(1, rest.size() - 2);
      const std::size_t comma = inner.find(',');
      ok = comma != std::string_view::npos && parse_double(inner.substr(0, comma), v.min_ms) &&
           parse_double(inner.substr(comma + 1), v.max_ms) && usable_ms(v.min_ms) && usable_ms(v.max_ms) &&
           v.min_ms <= v.max_ms;
    }
    if (ok) {
      block_.timers.push_back(std::move(v));
      ++values_;
    } else {
      issue("timer '" + std::string(name) + "': expected " +
                (block_.form == BlockForm::kMax ? "one time in [0, 1e14]" : "(min, max) with 0 <= min <= max <= 1e14") +
                ", got " +
                quoted(rest),
            1);
    }
    return true;
  }
  if (starts_with(t, "rank")) {
    const std::size_t colon = t.find(':');
    std::int64_t rank = -1;
    double ms = 0.0;
    if (colon == std::string_view::npos || !parse_int(t.substr(4, colon - 4), rank) ||
        !parse_double(t.substr(colon + 1), ms)) {
      issue("malformed rank line " + quoted(t) + " (expected 'rank <N>: <ms>')", 1);
    } else if (block_.timers.empty()) {
      issue("rank line before any timer name", 1);
    } else if (rank < 0 || rank >= kMaxRank) {
      issue("rank " + std::to_string(rank) + " out of range [0, " + std::to_string(kMaxRank) + ")", 1);
    } else if (!usable_ms(ms)) {
      issue("rank " + std::to_string(rank) + ": time must be a number of ms in [0, 1e14], got " +
                quoted(trim(t.substr(colon + 1))),
            1);
    } else {
      TimerValues& timer = block_.timers.back();
      const auto r = static_cast<std::size_t>(rank);
      if (seen_.size() <= r) seen_.resize(r + 1, 0);
      if (seen_[r]) {
        issue("timer '" + timer.name + "': rank " + std::to_string(rank) + " repeated (first value kept)", 1);
      } else {
        seen_[r] = 1;
        timer.ranks.push_back(static_cast<std::int32_t>(rank));
        timer.ms.push_back(ms);
        ++values_;
      }
    }
    return true;
  }
  if (t.back() == ':' && is_name(t.substr(0, t.size() - 1))) {
    if (!block_.timers.empty()) {
      for (std::int32_t r : block_.timers.back().ranks) seen_[static_cast<std::size_t>(r)] = 0;
    }
    TimerValues v;
    v.name = std::string(t.substr(0, t.size() - 1));
    v.line = line_;
    block_.timers.push_back(std::move(v));
    return true;
  }
  return false;
}

void TimerLogScanner::parse_line(std::string_view raw) {
  ++line_;
  const std::string_view text = strip_launcher_prefix(raw);
  if (in_block_) {
    if (parse_block_line(text)) return;
    close_block();
  }
  const std::string_view t = trim(text);
  if (in_arguments_) {
    if (t.find("end of arguments") != std::string_view::npos) {
      in_arguments_ = false;
      return;
    }
    std::string_view key, value;
    if (split_dotted(t, key, value)) return;  // "key ...: value" is not Megatron's listing form
    const std::size_t space = t.find(' ');
    if (space == std::string_view::npos) return;
    const std::string_view rest = trim_left(t.substr(space));
    std::size_t dots = 0;
    while (dots < rest.size() && rest[dots] == '.') ++dots;
    const std::string_view key_text = t.substr(0, space);
    if (dots >= 3 && is_name(key_text)) {
      const std::string value = quoted(trim(rest.substr(dots)));
      arguments_[std::string(key_text)] = value.substr(1, value.size() - 2);
    }
    return;
  }
  const BlockForm forms[] = {BlockForm::kAllRanks, BlockForm::kMinMax, BlockForm::kMax};
  const char* headers[] = {"times across ranks (ms):", "(min, max) time across ranks (ms):",
                           "max time across ranks (ms):"};
  for (int i = 0; i < 3; ++i) {
    if (t == headers[i]) {
      in_block_ = true;
      block_ = TimerBlock{};
      block_.form = forms[i];
      block_.line = line_;
      block_.iteration = iteration_;
      block_.iteration_ms = iteration_ms_;
      seen_.clear();
      return;
    }
  }
  if (starts_with(t, "---") && t.find(" arguments ") != std::string_view::npos) {
    in_arguments_ = true;
    return;
  }
  const std::size_t it = t.find("iteration ");
  if (it == std::string_view::npos) return;
  std::string_view rest = trim_left(t.substr(it + 10));
  const std::size_t slash = rest.find('/');
  std::int64_t iteration = -1;
  if (slash == std::string_view::npos || !parse_int(rest.substr(0, slash), iteration)) return;
  iteration_ = iteration;
  iteration_ms_ = std::numeric_limits<double>::quiet_NaN();
  static constexpr std::string_view kElapsed = "elapsed time per iteration (ms):";
  const std::size_t e = t.find(kElapsed);
  if (e != std::string_view::npos) {
    rest = t.substr(e + kElapsed.size());
    const std::size_t bar = rest.find('|');
    double ms = 0.0;
    if (parse_double(rest.substr(0, bar), ms) && usable_ms(ms)) iteration_ms_ = ms;
  }
}

}  // namespace relax_straggler::core::ingest
