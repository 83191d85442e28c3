// The shipped simulator inputs (profiles/): the VGG-16 and ResNet-50 model profiles made by
// tools/sim/model_profile.py, and the Cray XC40 (Aries) network. Each profile must parse, hold
// every parameter of the torchvision model exactly once with its element count, list the gradients
// in the order backward produces them, and run at the throughput its notes state.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "tutti/sim.hpp"

namespace {

using tutti::sim::ModelProfile;

const std::string profiles_dir = TUTTI_PROFILES_DIR;

ModelProfile load(const std::string& file) { return tutti::sim::read_profile_file(profiles_dir + "/" + file); }

std::size_t parameter_count(const ModelProfile& p) {
  return std::accumulate(p.gradients.begin(), p.gradients.end(), std::size_t{0},
                         [](std::size_t sum, const auto& g) { return sum + g.count; });
}

// Each named gradient is listed with the element count its layer's shape gives.
void expect_counts(const ModelProfile& p, const std::map<std::string, std::size_t>& expected) {
  std::map<std::string, std::size_t> counts;
  for (const auto& g : p.gradients) counts[g.name] = g.count;
  for (const auto& [name, count] : expected) {
    ASSERT_TRUE(counts.count(name)) << name << " missing";
    EXPECT_EQ(counts.at(name), count) << name;
  }
}

// Position in the forward pass of the layer a VGG-16 parameter belongs to (features.N, then
// classifier.N).
int vgg16_layer(const std::string& name) {
  const auto dot = name.find('.');
  const int index = std::stoi(name.substr(dot + 1));
  if (name.rfind("features.", 0) == 0) return index;
  if (name.rfind("classifier.", 0) == 0) return 100 + index;
  ADD_FAILURE() << "not a VGG-16 parameter: " << name;
  return -1;
}

// Position in the forward pass of the block a ResNet-50 parameter belongs to: the stem (conv1,
// bn1), layerS.B, fc. Inside a block the main path and the downsample branch may interleave.
int resnet50_block(const std::string& name) {
  if (name.rfind("conv1.", 0) == 0 || name.rfind("bn1.", 0) == 0) return 0;
  if (name.rfind("fc.", 0) == 0) return 1000;
  if (name.rfind("layer", 0) == 0) return 100 * (name[5] - '0') + std::stoi(name.substr(7)) + 1;
  ADD_FAILURE() << "not a ResNet-50 parameter: " << name;
  return -1;
}

// The checks both profiles share: parameters, element types, uniqueness, order, times, throughput.
void check_profile(const ModelProfile& p, const std::string& model, std::size_t parameters,
                   int (*layer_of)(const std::string&), double images_per_second, std::int64_t batch) {
  EXPECT_EQ(p.model, model);
  EXPECT_EQ(p.batch_size, batch);
  EXPECT_EQ(parameter_count(p), parameters);
  EXPECT_EQ(p.gradient_bytes(), parameters * 4);
  std::set<std::string> names;
  for (const auto& g : p.gradients) {
    EXPECT_TRUE(names.insert(g.name).second) << g.name << " listed twice";
    EXPECT_EQ(g.type, tutti::DataType::f32) << g.name;
    EXPECT_GE(g.backward_seconds, 0) << g.name;
  }
  // Backward runs from the last layer to the first: the layer positions never increase.
  for (std::size_t i = 1; i < p.gradients.size(); ++i)
    EXPECT_GE(layer_of(p.gradients[i - 1].name), layer_of(p.gradients[i].name))
        << p.gradients[i - 1].name << " before " << p.gradients[i].name;
  EXPECT_GT(p.forward_seconds, 0);
  EXPECT_GT(p.optimizer_seconds, 0);
  EXPECT_GT(p.backward_seconds(), 0);
  EXPECT_NEAR(static_cast<double>(p.batch_size) / p.compute_seconds(), images_per_second, images_per_second * 1e-6);
  EXPECT_GE(p.notes.size(), 3u) << "where it was measured, how it was scaled, what the target is";
}

TEST(SimProfiles, Vgg16) {
  const ModelProfile p = load("vgg16.profile");
  check_profile(p, "vgg16", 138'357'544, vgg16_layer, 14.5, 32);
  ASSERT_EQ(p.gradients.size(), 32u);  // 13 convolutions and 3 linear layers, weight and bias each
  // features.0: 64 x 3 x 3 x 3; features.28: 512 x 512 x 3 x 3; classifier.0: 4096 x (512 x 7 x 7).
  expect_counts(p, {{"features.0.weight", 1'728},
                    {"features.0.bias", 64},
                    {"features.28.weight", 2'359'296},
                    {"classifier.0.weight", 102'760'448},
                    {"classifier.6.weight", 4'096'000},
                    {"classifier.6.bias", 1'000}});
  EXPECT_EQ(vgg16_layer(p.gradients.front().name), 106);
  EXPECT_EQ(vgg16_layer(p.gradients.back().name), 0);
}

TEST(SimProfiles, Resnet50) {
  const ModelProfile p = load("resnet50.profile");
  check_profile(p, "resnet50", 25'557'032, resnet50_block, 31, 32);
  ASSERT_EQ(p.gradients.size(), 161u);  // 53 convolutions, 53 batch norms (weight, bias), fc (2)
  // conv1: 64 x 3 x 7 x 7; downsample: 256 x 64 x 1 x 1; layer4 conv2: 512 x 512 x 3 x 3; fc: 1000 x 2048.
  expect_counts(p, {{"conv1.weight", 9'408},
                    {"bn1.weight", 64},
                    {"layer1.0.downsample.0.weight", 16'384},
                    {"layer4.2.conv2.weight", 2'359'296},
                    {"fc.weight", 2'048'000},
                    {"fc.bias", 1'000}});
  EXPECT_EQ(resnet50_block(p.gradients.front().name), 1000);
  EXPECT_EQ(resnet50_block(p.gradients.back().name), 0);
}

// profiles/aries.network: Aries' published latency and link rate (docs/sim-profiles.md), with
// their sources; the other keys keep the simulator's defaults.
TEST(SimProfiles, AriesNetwork) {
  const std::string path = profiles_dir + "/aries.network";
  const tutti::sim::Network network = tutti::sim::read_network_file(path);
  EXPECT_DOUBLE_EQ(network.alpha, 2.2e-6);
  EXPECT_NEAR(network.beta, 1 / 4.7e9, 1e-18);
  const tutti::sim::Network defaults;
  EXPECT_EQ(network.intra_alpha, defaults.intra_alpha);
  EXPECT_EQ(network.gamma, defaults.gamma);
  std::ifstream in(path);
  int sources = 0;
  for (std::string line; std::getline(in, line);) sources += line.rfind("# source", 0) == 0;
  EXPECT_EQ(sources, 2) << "one source line for alpha, one for beta";
}

}  // namespace
