#pragma once
// Lather's public API in one include.

#include <lather/comm/comm.hpp>
#include <lather/core/config.hpp>
#include <lather/core/error.hpp>
#include <lather/core/kokkos_compat.hpp>
#include <lather/core/parameters.hpp>
#include <lather/core/product_precision.hpp>
#include <lather/core/tensor.hpp>
#include <lather/linalg/inverse_root.hpp>
#include <lather/optim/first_order.hpp>
#include <lather/optim/muon.hpp>
#include <lather/optim/sharded_muon.hpp>
#include <lather/optim/optimizer.hpp>
#include <lather/optim/partition.hpp>
#include <lather/optim/quantization.hpp>
#include <lather/optim/schedule.hpp>
#include <lather/optim/shampoo.hpp>
#include <lather/optim/shampoo_options.hpp>
#include <lather/optim/soap.hpp>

#if LATHER_ENABLE_HDF5
#include <lather/checkpoint/checkpoint.hpp>
#endif
