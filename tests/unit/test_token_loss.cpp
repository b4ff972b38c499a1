// The sequence-parallel distillation loss (student/token_loss.hpp): token rows in the head's
// order, and the group's shares adding up to the whole batch's loss, with and without frame
// weights, whatever the padding holds.
#include <gtest/gtest.h>

#include "core/errors.hpp"
#include "model/image_condition.hpp"
#include "student/student_parts.hpp"
#include "student/token_loss.hpp"

namespace wd::student::test_token_loss {
namespace {

/// Rank r of a group of n, for the loss's arithmetic, which reads no more of the group than that;
/// the all-to-all itself is exercised over real MPI ranks (tests/mpi, tests/launch).
class GroupPosition final : public TokenHeadExchange {
 public:
  GroupPosition(int rank, int size) : TokenHeadExchange(rank, size) {}
  torch::Tensor all_to_all(const torch::Tensor&) override {
    throw Error("the loss never exchanges anything");
  }
  const char* backend() const override { return "none"; }
};

constexpr std::array<std::int64_t, 3> kPatch{1, 2, 2};

TEST(TokenLoss, RowsAreTheHeadsOrderAndThePaddingIsZero) {
  torch::manual_seed(3);
  const auto latent = torch::randn({2, 3, 2, 4, 6});  // 2 x 2 x 3 = 12 tokens a sample
  const auto rows = latent_token_rows(latent, kPatch, 0, 14);
  ASSERT_EQ(rows.sizes(), (std::vector<std::int64_t>{2, 14, 12}));
  EXPECT_EQ(rows.slice(1, 12).abs().sum().item<double>(), 0.0);
  // WanDiT::unembed's inverse: rows (f,h,w), features (pt,ph,pw,C) back to [C,F,H,W].
  for (std::int64_t b = 0; b < 2; ++b) {
    const auto back = rows[b].slice(0, 0, 12).reshape({2, 2, 3, 1, 2, 2, 3}).permute({6, 0, 3, 1, 4, 2, 5}).reshape({3, 2, 4, 6});
    EXPECT_TRUE(torch::equal(back, latent[b]));
  }
  EXPECT_TRUE(torch::equal(latent_token_rows(latent, kPatch, 5, 9), rows.slice(1, 5, 9)));
}

TEST(TokenLoss, TheGroupsSharesAddUpToTheWholeLossWithAndWithoutFrameWeights) {
  torch::manual_seed(4);
  const auto prediction = torch::randn({2, 3, 3, 4, 6});  // 3 x 2 x 3 = 18 tokens a sample
  const auto target = torch::randn({2, 3, 3, 4, 6});
  // ti2v's image mode: sample 0's first frame clean (weight 0), sample 1 noised throughout.
  auto weights = torch::ones({2, 1, 3, 1, 1});
  weights[0][0][0].fill_(0);
  for (const auto& w : {torch::Tensor(), weights}) {
    const double whole = distill_loss(prediction, target, w).item<double>();
    for (const int n : {1, 2, 3, 4, 5}) {  // 4 and 5 pad 18 tokens to 20
      SCOPED_TRACE(std::to_string(n) + " ranks" + (w.defined() ? ", frame weights" : ""));
      const std::int64_t local = (18 + n - 1) / n;
      double shares = 0;
      for (int r = 0; r < n; ++r) {
        auto rows = latent_token_rows(prediction, kPatch, r * local, (r + 1) * local);
        // What the head gives padded rows carries no meaning: it must count nowhere.
        const auto real = std::max<std::int64_t>(0, std::min<std::int64_t>(local, 18 - r * local));
        rows.slice(1, real).normal_().mul_(100);
        shares += token_distill_loss(rows, target, w, kPatch, GroupPosition(r, n)).item<double>() / n;
      }
      EXPECT_NEAR(shares, whole, 1e-6 * whole);
    }
  }
}

TEST(TokenLoss, RowsOfAnotherSpanAreRefused) {
  const auto target = torch::zeros({1, 3, 1, 4, 4});  // 4 tokens
  EXPECT_THROW(token_distill_loss(torch::zeros({1, 3, 12}), target, {}, kPatch, GroupPosition(0, 2)), Error);
}

}  // namespace
}  // namespace wd::student::test_token_loss
