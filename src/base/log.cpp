// log.cpp: see log.h.
#include "src/base/log.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "src/base/check.h"

namespace sparta {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("SPARTA_LOG");
  if (!env || !*env) return LogLevel::info;
  try {
    return parse_log_level(env);
  } catch (const Error&) {
    return LogLevel::info;
  }
}

LogLevel g_level = level_from_env();

bool all_ranks_from_env() {
  const char* env = std::getenv("SPARTA_LOG_ALL");
  return env && std::string(env) == "1";
}

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warn: return "warn";
    case LogLevel::error: return "error";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) { g_level = level; }
LogLevel log_level() { return g_level; }

LogLevel parse_log_level(const std::string& name) {
  if (name == "debug") return LogLevel::debug;
  if (name == "info") return LogLevel::info;
  if (name == "warn") return LogLevel::warn;
  if (name == "error") return LogLevel::error;
  throw Error("log level: expected debug, info, warn or error, found '" + name + "'");
}

void log_print(LogLevel level, LogWho who, const char* fmt, ...) {
  if (level < g_level) return;
  static const bool all_env = all_ranks_from_env();
  int rank = identity_rank();
  bool all = who == LogWho::all || all_env;
  if (!all && rank > 0) return;
  va_list ap;
  va_start(ap, fmt);
  std::string body;
  {
    va_list ap2;
    va_copy(ap2, ap);
    int n = std::vsnprintf(nullptr, 0, fmt, ap2);
    va_end(ap2);
    body.resize(n > 0 ? n : 0);
    std::vsnprintf(&body[0], body.size() + 1, fmt, ap);
  }
  va_end(ap);
  FILE* out = level >= LogLevel::warn ? stderr : stdout;
  if (all)
    std::fprintf(out, "[%s:%d] %s%s%s\n", identity_host().c_str(), rank,
                 level == LogLevel::info ? "" : level_name(level), level == LogLevel::info ? "" : ": ", body.c_str());
  else
    std::fprintf(out, "%s%s%s\n", level == LogLevel::info ? "" : level_name(level),
                 level == LogLevel::info ? "" : ": ", body.c_str());
  std::fflush(out);
}

}  // namespace sparta
