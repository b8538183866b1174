#pragma once
// The switches graphward reads from the environment (GRAPHWARD_LOCALIZE_FAULTS, GRAPHWARD_POISON,
// GRAPHWARD_GEMM_TUNING, GRAPHWARD_CUDNN_FIND), all through one parser: 1, true, on, yes turn a
// switch on and 0, false, off, no turn it off (any case); unset or empty leaves its default;
// anything else is an Error naming the variable and its value ("false" turned switches on).
// graphward reads the environment, never writes it.
#include <optional>
#include <string_view>

namespace graphward::detail {

// `value` of the variable `name` as a switch: nullopt for empty, or throws naming both.
std::optional<bool> parse_env_switch(const char* name, std::string_view value);
// The variable `name` as a switch, or `fallback` when it is unset or empty.
bool env_switch(const char* name, bool fallback);

}  // namespace graphward::detail
