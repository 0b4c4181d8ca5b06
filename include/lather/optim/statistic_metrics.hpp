#pragma once
// What Shampoo reports of each statistic (Shampoo::metrics()), on its own so that the parts of the
// step that fill it need not include the optimizer's class.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_OPTIM)
#error "lather/optim/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

namespace lather::optim {

/// Per-statistic diagnostics (the reference's training metrics, plus failure bookkeeping).
struct StatisticMetrics {
  int parameter = 0;   ///< index into parameters()
  int size = 0;        ///< n of the n x n statistic
  int exponent = 0;    ///< p of the inverse p-th root
  int owner_rank = 0;  ///< rank of the group that computes its root
  double error = 0;    ///< inverse-root error of the last computation (max |M - I|)
  int iterations = 0;  ///< Newton iterations of the last computation
  int consecutive_failures = 0;
  long failures = 0;  ///< total rejected roots
};

}  // namespace lather::optim
