// The multi-token prediction block's own parts (mtp.h: the prologue u = [enorm(e), hnorm(h)]
// Weh^T with h = final_norm(x), its backward, and the shift of tokens and labels) against a
// float64 reference written here from Megatron-Core's definition, not from the block's code.
//
// The loss is L = sum(u * Gu) + sum(h * Gh): Gu stands for the gradient the MTP's transformer
// layer sends back into u, Gh for the main head's gradient into h (the prologue adds the MTP's
// own part of dh to it before the final norm's backward). Reference gradients of x, e, and of
// the four weights (final norm, enorm, hnorm, eh_proj) are central differences of the float64 L,
// so nothing here has seen the block's backward. The transformer layer between the prologue and
// the MTP head is an ordinary layer, checked by the layer tests; the whole model with its MTP is
// checked against finite differences of the combined loss in gpt_model_mpi_test.
//
// Tolerances: max |block - reference| <= tol * max |reference| per tensor, with tol 1e-4 in f32
// compute and 4e-2 in bf16 (h, the concatenation, eh_proj and the projection's output gradient
// are bf16 there: 8 bits each).
#include "epo/model/mtp.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "epo/core/error.h"
#include "epo/tensor/bf16.h"
#include "epo/tensor/random.h"
#include "float64_reference.h"

namespace epo::model {
namespace {

using epo::testing::linear;
using epo::testing::numeric_gradient;
using epo::testing::relative_error;
using epo::testing::rms_norm;
using epo::testing::to_vec;
using Vec = std::vector<double>;

constexpr double kEps = 1e-6;

// A tensor of either dtype as doubles.
Vec values_of(const Tensor& t) {
    if (t.dtype() == DType::kF32)
        return to_vec(t);
    std::vector<float> f(static_cast<size_t>(t.numel()));
    convert_bf16_to_f32(t.data<BF16>(), f.data(), f.size());
    return Vec(f.begin(), f.end());
}

struct RefMtp {
    Vec final_norm, enorm, hnorm, eh_proj;  // (H), (H), (H), (H, 2H)
};

struct RefOut {
    Vec h, u;
};

// h = final_norm(x); u = [enorm(e), hnorm(h)] Weh^T.
RefOut ref_prologue(const RefMtp& w, const Vec& x, const Vec& e, int64_t T, int64_t H) {
    RefOut out;
    out.h = rms_norm(x, w.final_norm, T, H, kEps);
    const Vec a = rms_norm(e, w.enorm, T, H, kEps);
    const Vec b = rms_norm(out.h, w.hnorm, T, H, kEps);
    Vec cat(static_cast<size_t>(T * 2 * H));
    for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < H; ++j) {
            cat[t * 2 * H + j] = a[t * H + j];
            cat[t * 2 * H + H + j] = b[t * H + j];
        }
    out.u = linear(cat, w.eh_proj, T, 2 * H, H);
    return out;
}

void check_prologue(DType cd, double tol) {
    const int64_t H = 16, S = 6, T = 2 * S;
    Param final_norm = make_param("decoder.final_layernorm.weight", {H}, DType::kF32);
    MtpParams p = make_mtp_params(H, cd);
    std::vector<Param*> weights = mtp_param_list(p);
    weights.push_back(&final_norm);
    uint64_t seed = 21;
    for (Param* w : weights) {
        if (w->shape().rank == 1)
            fill_uniform(w->master, seed++, 0.5f, 1.5f);
        else
            fill_normal(w->master, seed++, 0.0f, 0.4f);
        refresh_compute(*w);
        zero_grad(*w);
    }
    const Tensor x = Tensor::empty({T, H}, DType::kF32);
    const Tensor e = Tensor::empty({T, H}, DType::kF32);
    const Tensor gu = Tensor::empty({T, H}, DType::kF32);
    const Tensor gh = Tensor::empty({T, H}, DType::kF32);
    fill_normal(x, 1, 0.0f, 1.0f);
    fill_normal(e, 2, 0.0f, 1.0f);
    fill_normal(gu, 3, 0.0f, 1.0f);
    fill_normal(gh, 4, 0.0f, 1.0f);

    MtpState st;
    Arena scratch("scratch");
    mtp_prologue_forward(final_norm, p, static_cast<float>(kEps), x, e, st, scratch);
    st.du = st.arena.alloc({T, H}, DType::kF32);
    st.dh = st.arena.alloc({T, H}, DType::kF32);
    st.du.copy_from(gu);
    st.dh.copy_from(gh);
    const Tensor de = Tensor::empty({T, H}, DType::kF32);
    const Tensor dx = Tensor::empty({T, H}, DType::kF32);
    scratch.reset();
    mtp_prologue_backward(final_norm, p, /*fusion=*/true, x, e, st, de, dx, scratch);

    RefMtp w{to_vec(final_norm.master), to_vec(p.enorm.master), to_vec(p.hnorm.master),
             to_vec(p.eh_proj.master)};
    Vec xr = to_vec(x), er = to_vec(e);
    const Vec gur = to_vec(gu), ghr = to_vec(gh);
    const auto loss = [&] {
        const RefOut o = ref_prologue(w, xr, er, T, H);
        double l = 0;
        for (size_t i = 0; i < o.u.size(); ++i)
            l += o.u[i] * gur[i] + o.h[i] * ghr[i];
        return l;
    };
    const RefOut ref = ref_prologue(w, xr, er, T, H);
    struct Check {
        const char* name;
        Vec got, want;
    };
    const Check checks[] = {
        {"h", values_of(st.h), ref.h},
        {"u", values_of(st.u), ref.u},
        {"dx", to_vec(dx), numeric_gradient(xr, loss)},
        {"de", to_vec(de), numeric_gradient(er, loss)},
        {"final_norm", to_vec(final_norm.main_grad), numeric_gradient(w.final_norm, loss)},
        {"enorm", to_vec(p.enorm.main_grad), numeric_gradient(w.enorm, loss)},
        {"hnorm", to_vec(p.hnorm.main_grad), numeric_gradient(w.hnorm, loss)},
        {"eh_proj", to_vec(p.eh_proj.main_grad), numeric_gradient(w.eh_proj, loss)},
    };
    for (const Check& c : checks) {
        ASSERT_EQ(c.got.size(), c.want.size()) << c.name;
        const double err = relative_error(c.got, c.want);
        EXPECT_LE(err, tol) << c.name;
        std::printf("  %-10s rel err %.2e (tol %.0e)\n", c.name, err, tol);
    }
}

TEST(Mtp, PrologueMatchesFloat64ReferenceF32) {
    check_prologue(DType::kF32, 1e-4);
}

TEST(Mtp, PrologueMatchesFloat64ReferenceBf16) {
    check_prologue(DType::kBF16, 4e-2);
}

// Megatron-Core's roll: token t + 1 takes position t within each sequence; the last position of
// a sequence gets the fill value and no loss.
TEST(Mtp, ShiftAndMaskFollowEachSequence) {
    const std::vector<int32_t> tokens = {10, 11, 12, 20, 21, 22};
    EXPECT_EQ(mtp_shift(tokens, 3, 0), (std::vector<int32_t>{11, 12, 0, 21, 22, 0}));
    EXPECT_EQ(mtp_shift(tokens, 3, -1), (std::vector<int32_t>{11, 12, -1, 21, 22, -1}));
    EXPECT_EQ(mtp_loss_mask(6, 3), (std::vector<uint8_t>{1, 1, 0, 1, 1, 0}));
    EXPECT_THROW(mtp_shift(tokens, 4, 0), Error);
}

}  // namespace
}  // namespace epo::model
