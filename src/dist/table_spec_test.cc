// The one table spec (psflow/dist/table_spec.h): the initializer's spelling round-trips, every field
// of the table of fields reads back its own text (defaults included) and refuses what it cannot
// read with one line naming the table and the field, and ValidateTableSpec's checks.
#include "psflow/dist/table_spec.h"

#include <map>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psflow::dist {
namespace {

using ::testing::HasSubstr;

TableSpec Spec(std::string name, TableKind kind, int64_t dim, int64_t num_embeddings) {
  TableSpec t;
  t.name = std::move(name);
  t.kind = kind;
  t.dim = dim;
  t.num_embeddings = num_embeddings;
  return t;
}

TEST(TableSpecTest, InitializerSpellingsRoundTrip) {
  for (const char* text : {"zeros", "constant:0.25", "uniform:-1:1", "normal:0:0.5", "truncated_normal:0:0.01",
                           "truncated_normal:-3.5:1e-07"}) {
    absl::StatusOr<TableInitializer> init = TableInitializer::Parse(text);
    ASSERT_TRUE(init.ok()) << text << ": " << init.status();
    absl::StatusOr<TableInitializer> again = TableInitializer::Parse(init->ToString());
    ASSERT_TRUE(again.ok()) << init->ToString();
    EXPECT_EQ(*again, *init) << text << " -> " << init->ToString();
  }
  EXPECT_EQ(TableInitializer{}.ToString(), "truncated_normal:0:0.01");
  for (const char* bad :
       {"", "gaussian:0:1", "zeros:1", "uniform:1", "uniform:2:1", "normal:0:-1", "normal:0:nan", "constant:x"}) {
    absl::StatusOr<TableInitializer> init = TableInitializer::Parse(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(init.status())) << bad;
    EXPECT_THAT(std::string(init.status().message()), HasSubstr("truncated_normal:MEAN:STDDEV")) << bad;
  }
}

TEST(TableSpecTest, EveryFieldReadsBackItsOwnTextAndItsDefault) {
  std::set<std::string> names;
  // A value other than the default for each field.
  const std::map<std::string, std::string> other = {{"initializer", "uniform:-0.5:0.5"},
                                                    {"seed", "18446744073709551615"},
                                                    {"partition_strategy", "mod"},
                                                    {"admit_after", "3"},
                                                    {"steps_to_live", "40"},
                                                    {"max_rows", "1000"},
                                                    {"evict_every", "7"},
                                                    {"sparse_optimizer", "ftrl"},
                                                    {"storage", "disk"}};
  TableSpec spec;
  spec.name = "emb";
  for (const TableField& f : TableFields()) {
    SCOPED_TRACE(std::string(f.name));
    EXPECT_TRUE(names.insert(std::string(f.name)).second) << "twice in the table";
    EXPECT_FALSE(f.help.empty());
    EXPECT_TRUE(f.type == "int" || f.type == "text");
    // The default is TableSpec{}'s value, and reads back to it.
    TableSpec fresh;
    ASSERT_TRUE(SetTableField(&fresh, f.name, TableFieldDefault(f.name)).ok());
    EXPECT_EQ(fresh, TableSpec{});
    ASSERT_TRUE(other.contains(std::string(f.name))) << "give this test a non-default value for the new field";
    const std::string value = other.at(std::string(f.name));
    ASSERT_NE(value, TableFieldDefault(f.name));
    absl::Status s = SetTableField(&spec, f.name, value);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(TableFieldText(spec, f.name), value);
  }
  EXPECT_EQ(names.size(), other.size());
  // Setting the initializer keeps the seed (a field of its own).
  EXPECT_EQ(spec.initializer.seed, 18446744073709551615u);
  EXPECT_EQ(spec.initializer.kind, InitKind::kUniform);
  EXPECT_EQ(spec.lifecycle, (TableLifecycle{3, 40, 1000, 7}));
  EXPECT_EQ(spec.strategy, TableStrategy::kMod);
  EXPECT_EQ(spec.storage, TableStorage::kDisk);
  EXPECT_EQ(spec.sparse_optimizer, "ftrl");
}

TEST(TableSpecTest, AFieldItCannotReadIsRefusedNamingTheTableAndTheField) {
  TableSpec spec;
  spec.name = "emb";
  const std::pair<const char*, const char*> bad[] = {
      {"initializer", "gaussian"}, {"seed", "-1"},        {"partition_strategy", "hash"}, {"admit_after", "-1"},
      {"steps_to_live", "x"},      {"max_rows", "1.5"},   {"evict_every", "0"},           {"sparse_optimizer", "adamw"},
      {"storage", "tape"},         {"no_such_field", "1"}};
  for (const auto& [field, text] : bad) {
    absl::Status s = SetTableField(&spec, field, text);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << field;
    EXPECT_THAT(std::string(s.message()), HasSubstr("table 'emb': ")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field)) << s;
  }
  EXPECT_EQ(spec, Spec("emb", TableKind::kFixed, 0, 0));  // nothing was set
  // Not named yet (Python checks a module's options before it has a name): no "table ''".
  TableSpec unnamed;
  absl::Status s = SetTableField(&unnamed, "storage", "tape");
  EXPECT_EQ(s.message(), "storage=tape must be memory or disk");
}

TEST(TableSpecTest, ValidateNamesTheTableAndWhatIsWrong) {
  TableSpec ok = Spec("emb", TableKind::kFixed, 4, 10);
  EXPECT_TRUE(ValidateTableSpec(ok).ok());
  TableSpec dynamic = Spec("hashed", TableKind::kDynamic, 4, 0);
  dynamic.lifecycle = {2, 100, 1000, 10};
  EXPECT_TRUE(ValidateTableSpec(dynamic).ok());
  struct Case {
    TableSpec spec;
    const char* says;
  };
  TableSpec lifecycle_on_fixed = ok;
  lifecycle_on_fixed.lifecycle.max_rows = 5;
  TableSpec bad_rule = ok;
  bad_rule.sparse_optimizer = "lbfgs";
  TableSpec bad_init = ok;
  bad_init.initializer.stddev = -1;
  TableSpec bad_evict = dynamic;
  bad_evict.lifecycle.evict_every = 0;
  const Case cases[] = {{Spec("emb", TableKind::kFixed, 0, 10), "dim"},
                        {Spec("emb", TableKind::kFixed, 4, 0), "num_embeddings"},
                        {lifecycle_on_fixed, "dynamic tables only"},
                        {bad_rule, "sparse_optimizer 'lbfgs'"},
                        {bad_init, "stddev"},
                        {bad_evict, "evict_every"}};
  for (const Case& c : cases) {
    absl::Status s = ValidateTableSpec(c.spec);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.says;
    EXPECT_THAT(std::string(s.message()), HasSubstr("table '" + c.spec.name + "'")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.says)) << s;
  }
  EXPECT_THAT(std::string(ValidateTableSpec(TableSpec{}).message()), HasSubstr("without a name"));
}

TEST(TableSpecTest, DeclarationLayoutIsTheSpecsGeometryWithThePlansShards) {
  TableDeclaration d{Spec("emb", TableKind::kFixed, 2, 11), 3};
  d.spec.strategy = TableStrategy::kMod;
  EXPECT_EQ(d.layout().num_embeddings, 11);
  EXPECT_EQ(d.layout().num_shards, 3);
  EXPECT_EQ(d.layout().strategy, TableStrategy::kMod);
}

}  // namespace
}  // namespace psflow::dist
