// <tutti/version.hpp>: the headers' version is the library's (tutti::version()) and project()'s.
#include <gtest/gtest.h>

#include <string>

#include <tutti/tutti.hpp>

TEST(Version, HeadersAndLibraryAgree) { EXPECT_STREQ(tutti::version(), TUTTI_VERSION_STRING); }

TEST(Version, IsTheProjectVersion) {
  EXPECT_STREQ(TUTTI_VERSION_STRING, TUTTI_PROJECT_VERSION);
  const std::string parts = std::to_string(TUTTI_VERSION_MAJOR) + "." + std::to_string(TUTTI_VERSION_MINOR) + "." +
                            std::to_string(TUTTI_VERSION_PATCH);
  EXPECT_EQ(parts, TUTTI_PROJECT_VERSION);
}
