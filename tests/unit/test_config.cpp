// The config mechanism: flags, INI sections, precedence, validation messages, help defaults.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/config.hpp"
#include "core/logging.hpp"
#include "core/topology.hpp"

namespace wd::test_config {
namespace {

// A component shaped like the ones later issues add (teacher.*, train.*).
struct TeacherLike {
  std::string placement = "gpu";
  int ranks = 1;
  double lr = 1e-4;
  bool frozen = true;
  void bind(OptionTable& t) {
    t.bind("teacher.placement", placement, "where the teacher lives")
        .bind("teacher.ranks", ranks, "teacher ranks")
        .bind("train.lr", lr, "learning rate")
        .bind("teacher.frozen", frozen, "no gradients");
  }
  void validate() const {
    ConfigProblems p;
    p.check(ranks >= 1, "teacher.ranks(" + std::to_string(ranks) + ") must be >= 1");
    p.check(placement == "gpu" || placement == "stream",
            "teacher.placement(" + placement + ") must be gpu or stream");
    p.throw_if_any("config");
  }
};

std::string write_ini(const std::string& text) {
  const auto path = (std::filesystem::temp_directory_path() /
                     ("wd-config-" + std::to_string(::getpid()) + ".ini")).string();
  std::ofstream(path) << text;
  return path;
}

TEST(Config, IniSectionsBindAndTheCommandLineWins) {
  const auto ini = write_ini("[teacher]\nplacement = stream\nranks = 3\nfrozen = false\n[train]\nlr = 0.5\n");
  TeacherLike c;
  OptionTable t("test");
  c.bind(t);
  const auto parsed = parse_options({"--config", ini, "--teacher.ranks", "5"}, t);
  EXPECT_EQ(c.placement, "stream");  // from the file
  EXPECT_EQ(c.ranks, 5);             // the flag wins over the file's 3
  EXPECT_DOUBLE_EQ(c.lr, 0.5);
  EXPECT_FALSE(c.frozen);
  // Given: every key with a value from the file or a flag, not --config itself.
  EXPECT_EQ(parsed.given, (std::set<std::string>{"teacher.frozen", "teacher.placement", "teacher.ranks", "train.lr"}));
}

TEST(Config, DefaultsStayWithoutFileOrFlags) {
  TeacherLike c;
  OptionTable t("test");
  c.bind(t);
  EXPECT_TRUE(parse_options({}, t).given.empty());
  EXPECT_EQ(c.placement, "gpu");
  EXPECT_EQ(c.ranks, 1);
  EXPECT_TRUE(c.frozen);
  parse_options({"--teacher.frozen", "false"}, t);
  EXPECT_FALSE(c.frozen);
}

TEST(Config, UnknownKeysAndBadValuesNameTheirSource) {
  const auto ini = write_ini("[teacher]\nplacment = stream\n");
  TeacherLike c;
  OptionTable t("test");
  c.bind(t);
  try {
    parse_options({"--config", ini}, t);
    FAIL();
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(ini), std::string::npos) << m;
    EXPECT_NE(m.find("teacher.placment"), std::string::npos) << m;
  }
  EXPECT_THROW(parse_options({"--teacher.ranks", "many"}, t), ConfigError);
  EXPECT_THROW(parse_options({"--no-such-flag"}, t), ConfigError);
  EXPECT_THROW(parse_options({"--config", "/nonexistent/x.ini"}, t), ConfigError);
}

TEST(Config, ValidateListsEveryBadValue) {
  TeacherLike c;
  c.ranks = 0;
  c.placement = "moon";
  try {
    c.validate();
    FAIL();
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("teacher.ranks(0) must be >= 1"), std::string::npos) << m;
    EXPECT_NE(m.find("teacher.placement(moon) must be gpu or stream"), std::string::npos) << m;
  }
}

TEST(Config, HelpShowsTheFieldsDefaults) {
  TeacherLike c;
  c.ranks = 7;
  OptionTable t("test");
  c.bind(t);
  std::ostringstream os;
  os << t.description();
  EXPECT_NE(os.str().find("--teacher.ranks arg (=7)"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("--teacher.placement arg (=gpu)"), std::string::npos) << os.str();
  EXPECT_TRUE(parse_options({"--help"}, t).help);
}

TEST(Config, PositionalWordsAreCollected) {
  OptionTable t("test");
  auto parsed = parse_options({"a/b"}, t, "path");
  ASSERT_EQ(parsed.positional.size(), 1u);
  EXPECT_EQ(parsed.positional[0], "a/b");
}

TEST(Topology, DescribesRankAndRole) {
  Topology t{3, 16, 1, 8, Role::kStudent};
  EXPECT_EQ(t.describe(), "rank 3/16 student");
  EXPECT_EQ(Topology::single_process().describe(), "rank 0/1 teacher");
}

TEST(Logging, RejectsUnknownLevelsAndFormatsBytes) {
  EXPECT_THROW(init_logging(Topology::single_process(), "loud"), ConfigError);
  EXPECT_NO_THROW(init_logging(Topology::single_process(), "warn"));
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3.0 * 1024 * 1024 * 1024), "3.00 GiB");
}

}  // namespace
}  // namespace wd::test_config
