#include <lather/core/gemm.hpp>

#include <algorithm>

// BLAS's Fortran symbols (the library links BLAS already, through Kokkos Kernels' TPL and LAPACK),
// with the hidden string-length arguments that gfortran and ifort pass.
extern "C" {
void ssyrk_(const char* uplo, const char* trans, const int* n, const int* k, const float* alpha, const float* a,
            const int* lda, const float* beta, float* c, const int* ldc, std::size_t uplo_len, std::size_t trans_len);
void dsyrk_(const char* uplo, const char* trans, const int* n, const int* k, const double* alpha, const double* a,
            const int* lda, const double* beta, double* c, const int* ldc, std::size_t uplo_len, std::size_t trans_len);
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c, const int* ldc,
            std::size_t transa_len, std::size_t transb_len);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc, std::size_t transa_len, std::size_t transb_len);
}

namespace lather::Impl {

namespace {
// Row-major X [n, k] is column-major X^T (k x n, ld k): X X^T = (X^T)^T (X^T), BLAS trans 'T'.
// Row-major X [k, n] is column-major X^T (n x k, ld n): X^T X = (X^T)(X^T)^T, BLAS trans 'N'.
// The row-major upper triangle of C is the column-major lower triangle.
template <class T, class Syrk>
void gram(Syrk syrk, bool transpose, int n, int k, T alpha, const T* x, T beta, T* c, int ldc) {
  const char uplo = 'L', trans = transpose ? 'N' : 'T';
  const int lda = std::max(1, transpose ? n : k);
  syrk(&uplo, &trans, &n, &k, &alpha, x, &lda, &beta, c, &ldc, 1, 1);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the operands swap and keep
// their flags (a row-major matrix read as column-major is its transpose).
template <class T, class Gemm>
void product(Gemm gemm, char ta, char tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb,
             T beta, T* c, int ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // no BLAS sees a zero dimension: C = beta C
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j)
        c[std::size_t(i) * ldc + j] = beta == T(0) ? T(0) : beta * c[std::size_t(i) * ldc + j];
    return;
  }
  gemm(&tb, &ta, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc, 1, 1);
}
}  // namespace

void host_gram_upper(bool transpose, int n, int k, float alpha, const float* x, float beta, float* c, int ldc) {
  if (n == 0) return;
  gram(ssyrk_, transpose, n, k, alpha, x, beta, c, ldc);
}

void host_gram_upper(bool transpose, int n, int k, double alpha, const double* x, double beta, double* c, int ldc) {
  if (n == 0) return;
  gram(dsyrk_, transpose, n, k, alpha, x, beta, c, ldc);
}

void host_gemm(char ta, char tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
               float beta, float* c, int ldc) {
  product(sgemm_, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void host_gemm(char ta, char tb, int m, int n, int k, double alpha, const double* a, int lda, const double* b, int ldb,
               double beta, double* c, int ldc) {
  product(dgemm_, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace lather::Impl
