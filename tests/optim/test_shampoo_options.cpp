// optim::set_option / option_value, the text form of ShampooOptions (lather-train's --shampoo and
// config files): values out of a field's range are refused, never truncated, and every value
// option_value prints reads back to the same value (tests/fuzz/fuzz_options checks the same on
// fuzzed input; these are the cases it found).
#include <lather/core/error.hpp>
#include <lather/optim/shampoo_options.hpp>

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <string>

namespace {

using lather::optim::option_names;
using lather::optim::option_value;
using lather::optim::set_option;
using lather::optim::ShampooOptions;

std::string error_of(const std::string& name, const std::string& value) {
  ShampooOptions o;
  try {
    set_option(o, name, value);
  } catch (const lather::Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "no lather::Error for " << name << " = " << value;
  return {};
}

TEST(ShampooOptionText, IntegersPastTheirFieldAreRefusedNotTruncated) {
  // 2^32 + 1 used to become block_size 1.
  EXPECT_EQ(error_of("block_size", "4294967297"),
            "Shampoo option block_size: 4294967297 is out of the range of an int");
  EXPECT_EQ(error_of("root_max_iterations", "-2147483649"),
            "Shampoo option root_max_iterations: -2147483649 is out of the range of an int");
  EXPECT_EQ(error_of("start_preconditioning_step", "99999999999999999999"),
            "Shampoo option start_preconditioning_step: '99999999999999999999' is out of the range of a 64-bit "
            "integer");
  EXPECT_EQ(error_of("block_size", "12x"), "Shampoo option block_size: '12x' is not an integer");
  ShampooOptions o;
  set_option(o, "block_size", "2147483647");
  EXPECT_EQ(o.block_size, 2147483647);
}

TEST(ShampooOptionText, RealNumbers) {
  EXPECT_EQ(error_of("beta1", "1e400"), "Shampoo option beta1: '1e400' is out of the range of a double");
  EXPECT_EQ(error_of("beta1", ""), "Shampoo option beta1: '' is not a number");
  EXPECT_EQ(error_of("beta1", "0.5 "), "Shampoo option beta1: '0.5 ' is not a number");
  ShampooOptions o;
  set_option(o, "matrix_epsilon", "4.9e-324");  // subnormal: a number, not an error
  EXPECT_EQ(o.matrix_epsilon, 4.9e-324);
}

TEST(ShampooOptionText, EveryPrintedValueReadsBackExactly) {
  // Six digits (the stream default) printed DBL_MIN as 2.22507e-308, below DBL_MIN, which did not
  // read back; 0.1 + 0.2 and 1/3 need 17 digits.
  for (const double x : {DBL_MIN, 0.1 + 0.2, 1.0 / 3.0, 4.9e-324, 1e-10, 0.001, DBL_MAX}) {
    for (const char* name : {"diagonal_epsilon", "matrix_epsilon", "root_tolerance", "learning_rate"}) {
      ShampooOptions o, copy;
      if (std::string(name) == "diagonal_epsilon") o.diagonal_epsilon = x;
      if (std::string(name) == "matrix_epsilon") o.matrix_epsilon = x;
      if (std::string(name) == "root_tolerance") o.root.tolerance = x;
      if (std::string(name) == "learning_rate") o.learning_rate.peak = x;
      const std::string text = option_value(o, name);
      set_option(copy, name, text);
      EXPECT_EQ(option_value(copy, name), text) << name << " = " << text;
    }
  }
  ShampooOptions defaults;
  EXPECT_EQ(option_value(defaults, "learning_rate"), "0.001");  // short values stay short
  EXPECT_EQ(option_value(defaults, "diagonal_epsilon"), "1e-10");
  for (const std::string& name : option_names()) {
    ShampooOptions copy;
    set_option(copy, name, option_value(defaults, name));
    EXPECT_EQ(option_value(copy, name), option_value(defaults, name)) << name;
  }
}

// The reference spells the option "precondtioner_type"; both spellings set the same field, the
// reference's upper-case names and lower case are accepted, anything else is named.
TEST(ShampooOptionText, PreconditionerTypeUnderBothSpellings) {
  using lather::optim::PreconditionerType;
  ShampooOptions o;
  EXPECT_EQ(option_value(o, "precondtioner_type"), "ALL");
  set_option(o, "precondtioner_type", "INPUT");
  EXPECT_EQ(o.preconditioner_type, PreconditionerType::input);
  set_option(o, "preconditioner_type", "output");
  EXPECT_EQ(o.preconditioner_type, PreconditionerType::output);
  EXPECT_EQ(option_value(o, "preconditioner_type"), "OUTPUT");
  try {
    set_option(o, "precondtioner_type", "LEFT");
    FAIL() << "LEFT was accepted";
  } catch (const lather::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'LEFT'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ALL, INPUT or OUTPUT"), std::string::npos) << e.what();
  }
  // Which dimensions get a statistic: rank <= 1 always its one; INPUT all but the last.
  EXPECT_EQ(lather::optim::preconditioned_dimensions(1, PreconditionerType::output), std::vector<int>{0});
  EXPECT_EQ(lather::optim::preconditioned_dimensions(3, PreconditionerType::input), (std::vector<int>{0, 1}));
  EXPECT_EQ(lather::optim::preconditioned_dimensions(3, PreconditionerType::output), std::vector<int>{2});
  EXPECT_EQ(lather::optim::preconditioned_dimensions(2, PreconditionerType::all), (std::vector<int>{0, 1}));
}

}  // namespace
