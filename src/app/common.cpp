// What every subcommand's --help prints.
#include <iostream>

#include "app/commands.hpp"

namespace wd::app {

void print_help(const std::string& usage, const std::string& about, const OptionTable& table) {
  std::cout << "usage: " << usage << "\n\n" << about << "\n\n" << table.description() << "\n"
            << "General:\n"
            << "  -h [ --help ]          show this help and exit\n"
            << "  --config FILE          INI file with the same keys as the flags ([section] key =\n"
            << "                         value); flags given on the command line win\n";
}

}  // namespace wd::app
