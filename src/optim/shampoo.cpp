#include <lather/optim/impl/shampoo_impl.hpp>

namespace lather::optim {

template class Shampoo<DefaultExecutionSpace, float>;
template class Shampoo<DefaultExecutionSpace, double>;
#if LATHER_HOST_SPACE_DIFFERS
template class Shampoo<DefaultHostExecutionSpace, float>;
template class Shampoo<DefaultHostExecutionSpace, double>;
#endif

}  // namespace lather::optim
