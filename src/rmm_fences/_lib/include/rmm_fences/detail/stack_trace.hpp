/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * Where an allocation or a free came from: Python frames when the call came through Python,
 * native frames otherwise (symbolized only when printed).
 */
#pragma once

#include <cxxabi.h>
#include <execinfo.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace rmm_fences::mr::detail {

/// A captured call stack.
struct stack_trace {
  std::vector<void*> native;  ///< return addresses, innermost first
  std::string python;         ///< formatted Python frames, outermost first (empty: none)

  /// Fills `out` with the calling thread's Python frames; false when it has none.
  using python_hook = bool (*)(std::string& out);

  /// The Python frames if `hook` finds any, else the native ones (skipping `skip` frames).
  static std::shared_ptr<stack_trace const> capture(python_hook hook, int skip = 2)
  {
    auto trace = std::make_shared<stack_trace>();
    if (hook != nullptr && hook(trace->python) && !trace->python.empty()) { return trace; }
    constexpr int max_frames = 48;
    void* frames[max_frames];
    int const n = ::backtrace(frames, max_frames);
    for (int i = skip; i < n; ++i) {
      trace->native.push_back(frames[i]);
    }
    return trace;
  }

  /// One frame per line.
  [[nodiscard]] std::string to_string() const
  {
    if (!python.empty()) { return python; }
    std::string out;
    if (native.empty()) { return out; }
    char** symbols = ::backtrace_symbols(native.data(), static_cast<int>(native.size()));
    for (std::size_t i = 0; i < native.size(); ++i) {
      out += "  ";
      out += symbols != nullptr ? demangle(symbols[i]) : std::string{"?"};
      out += '\n';
    }
    std::free(symbols);  // NOLINT: allocated by backtrace_symbols
    return out;
  }

 private:
  /// "module(mangled+0x1f) [0x...]" -> "module(demangled+0x1f) [0x...]"
  static std::string demangle(char const* symbol)
  {
    std::string line{symbol};
    auto const open = line.find('(');
    auto const plus = line.find('+', open);
    if (open == std::string::npos || plus == std::string::npos || plus == open + 1) { return line; }
    auto const mangled = line.substr(open + 1, plus - open - 1);
    int status         = 0;
    char* readable     = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
    if (status == 0 && readable != nullptr) {
      line = line.substr(0, open + 1) + readable + line.substr(plus);
    }
    std::free(readable);  // NOLINT: allocated by __cxa_demangle
    return line;
  }
};

}  // namespace rmm_fences::mr::detail
