#include <lather/optim/impl/sharded_muon_impl.hpp>

namespace lather::optim {

template class ShardedMuon<DefaultExecutionSpace, float>;
template class ShardedMuon<DefaultExecutionSpace, double>;
#if LATHER_HOST_SPACE_DIFFERS
template class ShardedMuon<DefaultHostExecutionSpace, float>;
template class ShardedMuon<DefaultHostExecutionSpace, double>;
#endif

}  // namespace lather::optim
