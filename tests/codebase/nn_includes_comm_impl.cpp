// Compiled as the nn area, which may use comm's public headers but not its impl/ ones.
#include <lather/comm/impl/reduce_impl.hpp>
