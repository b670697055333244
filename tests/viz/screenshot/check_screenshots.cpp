// Checks two headless screenshots of the visualizer taken at different trace positions:
// each has real content (not blank), and the score-tile grid's pixels differ between them.
//
//   check_screenshots A.png A.layout.json B.png B.layout.json
//
// The layout files (written by flashlab_viz --layout) give where the score grid was drawn.
#include <stb_image.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace {

struct Image {
  int width = 0, height = 0;
  std::vector<unsigned char> rgba;
  unsigned pixel(int x, int y) const {
    const unsigned char* p = &rgba[(static_cast<std::size_t>(y) * width + x) * 4];
    return p[0] << 16 | p[1] << 8 | p[2];
  }
};

Image load_png(const std::string& path) {
  Image image;
  int channels = 0;
  unsigned char* data = stbi_load(path.c_str(), &image.width, &image.height, &channels, 4);
  if (!data) throw std::runtime_error("cannot read " + path);
  image.rgba.assign(data, data + static_cast<std::size_t>(image.width) * image.height * 4);
  stbi_image_free(data);
  return image;
}

struct Rect {
  int x0, y0, x1, y1;
};

Rect load_grid_rect(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot read " + path);
  const auto layout = nlohmann::json::parse(file);
  const auto& r = layout.at("score_grid");
  return {r.at(0).get<int>(), r.at(1).get<int>(), r.at(2).get<int>(), r.at(3).get<int>()};
}

// Not blank: many colours, and a good share of pixels away from the background colour.
void check_content(const Image& image, const std::string& name) {
  std::set<unsigned> colours;
  std::size_t background = 0;
  const unsigned corner = image.pixel(image.width - 1, image.height - 1);
  for (int y = 0; y < image.height; y += 2)
    for (int x = 0; x < image.width; x += 2) {
      colours.insert(image.pixel(x, y));
      background += image.pixel(x, y) == corner;
    }
  const double samples = (image.width / 2.0) * (image.height / 2.0);
  std::printf("%s: %dx%d, %zu colours, %.1f%% background\n", name.c_str(), image.width, image.height, colours.size(),
              100.0 * background / samples);
  if (colours.size() < 32) throw std::runtime_error(name + " looks blank: only " + std::to_string(colours.size()) + " colours");
  if (background > 0.95 * samples) throw std::runtime_error(name + " looks blank: over 95% one colour");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: check_screenshots A.png A.layout.json B.png B.layout.json\n");
    return 2;
  }
  try {
    const Image a = load_png(argv[1]), b = load_png(argv[3]);
    const Rect grid = load_grid_rect(argv[2]), grid_b = load_grid_rect(argv[4]);
    check_content(a, argv[1]);
    check_content(b, argv[3]);
    if (a.width != b.width || a.height != b.height) throw std::runtime_error("the screenshots differ in size");
    if (grid.x0 != grid_b.x0 || grid.y0 != grid_b.y0 || grid.x1 != grid_b.x1 || grid.y1 != grid_b.y1)
      throw std::runtime_error("the score grid moved between the screenshots");
    if (grid.x1 - grid.x0 < 20 || grid.y1 - grid.y0 < 20 || grid.x0 < 0 || grid.y0 < 0 || grid.x1 > a.width ||
        grid.y1 > a.height)
      throw std::runtime_error("the score grid's rectangle is empty or outside the picture");
    std::size_t differing = 0, total = 0;
    std::set<unsigned> grid_colours;
    for (int y = grid.y0; y < grid.y1; ++y)
      for (int x = grid.x0; x < grid.x1; ++x) {
        ++total;
        differing += a.pixel(x, y) != b.pixel(x, y);
        grid_colours.insert(a.pixel(x, y));
      }
    std::printf("score grid %dx%d: %zu colours; %.1f%% of its pixels differ between the positions\n", grid.x1 - grid.x0,
                grid.y1 - grid.y0, grid_colours.size(), 100.0 * differing / total);
    if (grid_colours.size() < 3) throw std::runtime_error("the score grid is drawn in fewer than 3 colours");
    if (differing < total / 100) throw std::runtime_error("the score grid hardly changes between the two positions");
  } catch (const std::exception& error) {
    std::fprintf(stderr, "check_screenshots: %s\n", error.what());
    return 1;
  }
  std::puts("screenshots OK");
  return 0;
}
