// The order a plan's steps need (step_dependencies) and their spread over parallel lanes
// (schedule_lanes): every true dependency is kept, and independent steps do overlap.
#include <gtest/gtest.h>

#include <random>

#include "seam/seam.h"
#include "test_util.h"

using namespace seam;

namespace {

// Whether a follows b through the dependency lists (b is an ancestor of a).
bool follows(const std::vector<std::vector<int>>& deps, int a, int b) {
  std::vector<int> stack{a};
  std::vector<bool> seen(deps.size(), false);
  while (!stack.empty()) {
    int s = stack.back();
    stack.pop_back();
    for (int d : deps[static_cast<size_t>(s)]) {
      if (d == b) return true;
      if (!seen[static_cast<size_t>(d)]) seen[static_cast<size_t>(d)] = true, stack.push_back(d);
    }
  }
  return false;
}

// Every dependency is met by the lane order or by a wait on that lane at or after it.
void expect_honoured(const std::vector<std::vector<int>>& deps, const LaneSchedule& s, int lanes) {
  ASSERT_EQ(s.lane.size(), deps.size());
  EXPECT_LE(s.lanes_used, lanes);
  for (size_t j = 0; j < deps.size(); ++j) {
    EXPECT_GE(s.lane[j], 0);
    EXPECT_LT(s.lane[j], s.lanes_used);
    for (int d : deps[j]) {
      ASSERT_LT(d, static_cast<int>(j));
      bool met = s.lane[static_cast<size_t>(d)] == s.lane[j];
      for (int w : s.waits[j]) met = met || (s.lane[static_cast<size_t>(w)] == s.lane[static_cast<size_t>(d)] && w >= d);
      EXPECT_TRUE(met) << "step " << j << " on lane " << s.lane[j] << " does not wait for step " << d << " on lane "
                       << s.lane[static_cast<size_t>(d)];
    }
  }
}

bool overlaps(const BufferRef& a, const BufferRef& b) {
  return a.region == b.region && a.offset < b.offset + b.bytes() && b.offset < a.offset + a.bytes() && a.bytes() &&
         b.bytes();
}

// reuse_gap 1: the plan a GPU running steps side by side gets.
Plan mlp_training_plan(int reuse_gap = 1) {
  Graph g;
  Var loss = seam::testing::mlp_loss(g, 64, 32, {48, 40}, 10);
  Model m(g);
  return m.compile({.loss = loss.id(), .optimizer = OptimizerConfig::adam(1e-3), .reuse_gap = reuse_gap}).plan();
}

}  // namespace

// Byte ranges share a byte only in one region, adjacent ranges none, empty ones none.
TEST(StepDependencies, BufferRangesOverlapWhereTheyShareAByte) {
  auto ref = [](Region r, size_t offset, int64_t floats) { return BufferRef{r, offset, {DType::f32, {floats}}}; };
  const BufferRef a = ref(Region::arena, 64, 4);  // bytes 64..80
  EXPECT_TRUE(a.overlaps(ref(Region::arena, 76, 1)));
  EXPECT_TRUE(ref(Region::arena, 0, 100).overlaps(a));  // containing it
  EXPECT_TRUE(a.overlaps(a));
  EXPECT_FALSE(a.overlaps(ref(Region::arena, 80, 4)));  // adjacent
  EXPECT_FALSE(ref(Region::arena, 48, 4).overlaps(a));
  EXPECT_FALSE(a.overlaps(ref(Region::grads, 64, 4)));  // another region, the same offsets
  EXPECT_FALSE(a.overlaps(ref(Region::arena, 68, 0)));  // empty, inside it
  EXPECT_FALSE(ref(Region::arena, 68, 0).overlaps(a));
}

// Each step follows the last step before it that wrote any byte it reads or writes, and
// every step before it that read any byte it writes (memory reuse in the arena).
TEST(StepDependencies, FollowEveryWriterAndEveryReaderOfWhatAStepOverwrites) {
  const Plan plan = mlp_training_plan();
  const auto deps = step_dependencies(plan);
  ASSERT_EQ(deps.size(), plan.steps.size());
  int checked = 0;
  for (size_t j = 0; j < plan.steps.size(); ++j)
    for (size_t i = 0; i < j; ++i) {
      const PlanStep &a = plan.steps[i], &b = plan.steps[j];
      bool conflict = false;
      for (auto& w : a.out) {
        for (auto& r : b.in) conflict = conflict || overlaps(w, r);
        for (auto& o : b.out) conflict = conflict || overlaps(w, o);
      }
      for (auto& r : a.in)
        for (auto& o : b.out) conflict = conflict || overlaps(r, o);
      if (conflict) {
        EXPECT_TRUE(follows(deps, static_cast<int>(j), static_cast<int>(i)))
            << b.name << " does not follow " << a.name << "\n" << plan.str();
        ++checked;
      }
    }
  EXPECT_GT(checked, 10);
}

// In backward, the last layer's weight gradient and the input gradient it passes down
// read the same dy and depend on each other in no way: they go to different lanes.
TEST(ScheduleLanes, AWeightGradientRunsBesideTheInputGradient) {
  const Plan plan = mlp_training_plan();
  const auto deps = step_dependencies(plan);
  int wgrad = -1, dgrad = -1;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    if (plan.steps[i].op == Op::linear_grad_weight_bias && wgrad < 0) wgrad = static_cast<int>(i);
    if (plan.steps[i].op == Op::matmul_act_grad && dgrad < 0) dgrad = static_cast<int>(i);
  }
  ASSERT_GE(wgrad, 0) << plan.str();
  ASSERT_GE(dgrad, 0) << plan.str();
  EXPECT_FALSE(follows(deps, std::max(wgrad, dgrad), std::min(wgrad, dgrad))) << plan.str();
  // Without the gap, the input gradient takes the place of the activation the weight
  // gradient reads, which orders them.
  const Plan tight = mlp_training_plan(0);
  EXPECT_TRUE(follows(step_dependencies(tight), std::max(wgrad, dgrad), std::min(wgrad, dgrad))) << tight.str();
  EXPECT_LE(tight.arena_bytes, plan.arena_bytes);
  for (int lanes : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(lanes) + " lanes");
    const LaneSchedule s = schedule_lanes(deps, lanes);
    expect_honoured(deps, s, lanes);
    if (lanes == 1) {
      EXPECT_EQ(s.lanes_used, 1);
      for (auto& w : s.waits) EXPECT_TRUE(w.empty());
    } else {
      EXPECT_NE(s.lane[static_cast<size_t>(wgrad)], s.lane[static_cast<size_t>(dgrad)]);
    }
  }
}

TEST(ScheduleLanes, RandomGraphsKeepEveryDependency) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 80);
    const double p = std::uniform_real_distribution<double>(0.0, 0.3)(rng);
    std::vector<std::vector<int>> deps(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < j; ++i)
        if (std::uniform_real_distribution<double>(0, 1)(rng) < p) deps[static_cast<size_t>(j)].push_back(i);
    const int lanes = 1 + static_cast<int>(rng() % 4);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_honoured(deps, schedule_lanes(deps, lanes), lanes);
  }
}

// a -> {b, c} -> d: b and c side by side, d waits for the other lane.
TEST(ScheduleLanes, ADiamondUsesTwoLanes) {
  const std::vector<std::vector<int>> deps = {{}, {0}, {0}, {1, 2}};
  const LaneSchedule s = schedule_lanes(deps, 4);
  EXPECT_EQ(s.lanes_used, 2);
  EXPECT_EQ(s.lane[1], s.lane[0]);
  EXPECT_NE(s.lane[2], s.lane[1]);
  EXPECT_EQ(s.waits[3].size(), 1u);
  expect_honoured(deps, s, 4);
}

TEST(ScheduleLanes, AStreamCountOutOfRangeIsRefusedOnEveryDevice) {
  Graph g;
  (void)g.input("x", {2});
  for (int bad : {0, -1, 17}) {
    try {
      Model m(g, {.cuda_streams = bad});
      ADD_FAILURE() << bad << " streams accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cuda_streams must be in [1, 16], got " + std::to_string(bad)),
                std::string::npos)
          << e.what();
    }
  }
  Model ok(g, {.cuda_streams = 16});
}
