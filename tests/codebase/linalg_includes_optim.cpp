// Compiled as the linalg area, which lies below optim: the include must stop the build.
#include <lather/optim/shampoo.hpp>
