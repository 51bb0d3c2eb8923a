// log.h: a rank-aware logger. Messages go to rank 0 only by default (ROOT) or to every rank (ALL), at a
// level: debug < info < warn < error. The level comes from set_log_level() or the SPARTA_LOG environment
// variable (debug|info|warn|error); SPARTA_LOG_ALL=1 makes ROOT messages print on every rank.
// Each line starts with "[host:rank]" when printed by all ranks, so interleaved output stays readable.
#pragma once

#include <string>

namespace sparta {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3 };
enum class LogWho { root, all };

void set_log_level(LogLevel level);
LogLevel log_level();
// Parses debug|info|warn|error; throws sparta::Error naming the value otherwise.
LogLevel parse_log_level(const std::string& name);
void log_print(LogLevel level, LogWho who, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

}  // namespace sparta

#define LOG_INFO(...) ::sparta::log_print(::sparta::LogLevel::info, ::sparta::LogWho::root, __VA_ARGS__)
#define LOG_WARN(...) ::sparta::log_print(::sparta::LogLevel::warn, ::sparta::LogWho::root, __VA_ARGS__)
#define LOG_DEBUG(...) ::sparta::log_print(::sparta::LogLevel::debug, ::sparta::LogWho::root, __VA_ARGS__)
#define LOG_ALL(level, ...) ::sparta::log_print(::sparta::LogLevel::level, ::sparta::LogWho::all, __VA_ARGS__)
