/*
 * SPDX-License-Identifier: Apache-2.0
 *
 * The hazard tracker's report: the hazards it recorded, numbered, and the hook that hears of
 * those not raised to the caller.
 */
#pragma once

#include <rmm_fences/mr/hazards.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace rmm_fences::mr::detail::tracker {

/**
 * @brief The hazards recorded by a hazard tracker, and its hook.
 *
 * No lock: `hazard_tracker_core` calls every member under its mutex, and calls the hook
 * (`notices`) after releasing it.
 */
class hazard_log {
 public:
  /// Called for each hazard not raised to the caller, with the tracker's lock released.
  using hazard_hook = void (*)(hazard_record const&, void* context);

  /// The most hazard records kept (later ones are counted only).
  static constexpr std::size_t max_hazards = 10000;

  void set_hook(hazard_hook hook, void* context) noexcept
  {
    hook_    = hook;
    context_ = context;
  }

  [[nodiscard]] std::pair<hazard_hook, void*> hook() const noexcept { return {hook_, context_}; }

  /// Records `hazard` (numbered) and queues it in `notices` for the hook unless it is raised;
  /// returns it.
  hazard_record note(hazard_record hazard, std::vector<hazard_record>& notices)
  {
    count_ += 1;
    hazard.serial = count_;
    if (hazards_.size() < max_hazards) { hazards_.push_back(hazard); }
    if (!hazard.raised && hook_ != nullptr) { notices.push_back(hazard); }
    return hazard;
  }

  /// Records a bad free; a strict call (`stopped` given) gets it in `*stopped`, and true.
  bool stop_or_note(hazard_record hazard,
                    hazard_record* stopped,
                    std::vector<hazard_record>& notices)
  {
    hazard.raised = stopped != nullptr;
    auto noted    = note(std::move(hazard), notices);
    if (stopped != nullptr) { *stopped = std::move(noted); }
    return stopped != nullptr;
  }

  /// The hazards recorded since construction or `clear`, oldest first.
  [[nodiscard]] std::vector<hazard_record> const& records() const noexcept { return hazards_; }

  /// Forgets the records (the count goes on).
  void clear() noexcept { hazards_.clear(); }

  /// Hazards observed, including those not kept.
  [[nodiscard]] std::uint64_t count() const noexcept { return count_; }

 private:
  std::vector<hazard_record> hazards_;
  std::uint64_t count_{};
  hazard_hook hook_{};
  void* context_{};
};

}  // namespace rmm_fences::mr::detail::tracker
