// The control: compiled as the optim area, which uses linalg, comm and core and its own impl/
// headers; it must build, so that the failures beside it come from the layer checks alone.
#include <lather/comm/reduce.hpp>
#include <lather/core/tensor.hpp>
#include <lather/linalg/inverse_root.hpp>
#include <lather/optim/impl/shampoo_plan.hpp>
#include <lather/optim/shampoo.hpp>

int lather_layer_probe() { return 0; }
