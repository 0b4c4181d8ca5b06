// Compiled as a program (the top layer): every area's public headers, no impl/ header.
#include <lather/optim/impl/shampoo_impl.hpp>
