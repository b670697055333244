// flashlab_viz: watch a FlashAttention schedule work, tile by tile.
//
//   flashlab_viz                                   # FA2 on N = 256, d = 64, 64 x 64 blocks
//   flashlab_viz --schedule fa2 --compare standard --seqlen 192 --mask causal --blocks 32x32
//   flashlab_viz --trace fa2.json                  # replay a saved trace
//   flashlab_viz --schedule ring --devices 4 --ordering zigzag --mask causal --seqlen 128 --blocks 16x16
//   flashlab_viz --screenshot out.png --frames 3 --position 0.4   # headless: write a PNG, exit
//
// The stages follow Dear ImGui's GLFW + OpenGL 3 example: options, window and GL context, ImGui
// context and backends, the state, the loop, cleanup in reverse order.
#include <GLFW/glfw3.h>
#include <imgui.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <stb_image_write.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "app.hpp"
#include "sim/decimal.hpp"
#include "sim/output_file.hpp"

using namespace flashlab;
using namespace flashlab::viz;

namespace {

// ---------------------------------------------------------------------------------------------
// Options

struct Options {
  RecordRequest request;
  std::string compare;        // second schedule, side by side
  std::string trace_path;     // replay this file instead of running
  std::string save_trace_path;
  std::string screenshot_path;
  std::string layout_path;    // headless: where the score grid was drawn, as JSON
  int frames = 3;
  int hover_row = -1, hover_col = -1;  // headless: the score the mouse rests on (shows S and P)
  double position = 0.35;     // headless: fraction of the trace already played
  int width = 1600, height = 1000;
};

const char* kUsage =
    "usage: flashlab_viz [--schedule NAME] [--compare NAME] [--seqlen N | --seqlen-q N --seqlen-k N]\n"
    "                    [--head-dim D] [--mask none|causal|window] [--window W] [--dtype fp32|fp16|bf16]\n"
    "                    [--blocks BRxBC | --sram BYTES [--block-rule fitting|paper]] [--trace FILE] [--save-trace FILE]\n"
    "                    [--screenshot FILE.png [--frames N] [--position P] [--hover ROWxCOL] [--layout FILE.json]]\n"
    "                    [--size WxH] [--devices P] [--ordering contiguous|striped|zigzag]   (ring schedules)\n"
    "Schedules: the registry of sim/schedules.hpp (flashlab list). --position P is the fraction of the\n"
    "trace played before the screenshot, 0 .. 1. See docs/visualizer.md.\n";

// Numbers go through the command lines' one decimal parser (sim/decimal.hpp): no octal, hex,
// signs or spaces, the range named in every refusal.
int parse_int(const std::string& option, const std::string& text, int low, int high) {
  return static_cast<int>(sim::parse_decimal(text, option, low, high));
}

std::pair<int, int> parse_pair(const std::string& option, const std::string& text, int low, int high) {
  const auto x = text.find('x');
  if (x == std::string::npos) throw std::invalid_argument(option + " = '" + text + "'; allowed: AxB, e.g. 64x64");
  return {parse_int(option, text.substr(0, x), low, high), parse_int(option, text.substr(x + 1), low, high)};
}

Options parse_options(int argc, char** argv) {
  Options o;
  RecordRequest& r = o.request;
  r.seqlen_q = r.seqlen_k = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string option = argv[i];
    if (option == "--help" || option == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw std::invalid_argument(option + ": missing value (or unknown option); see --help");
    const std::string value = argv[++i];
    if (option == "--schedule") {
      r.schedule = value;
    } else if (option == "--compare") {
      o.compare = value;
    } else if (option == "--seqlen") {
      r.seqlen_q = r.seqlen_k = parse_int(option, value, 1, 1 << 24);
    } else if (option == "--seqlen-q") {
      r.seqlen_q = parse_int(option, value, 1, 1 << 24);
    } else if (option == "--seqlen-k") {
      r.seqlen_k = parse_int(option, value, 1, 1 << 24);
    } else if (option == "--head-dim") {
      r.head_dim = parse_int(option, value, 1, 1024);
    } else if (option == "--mask") {
      if (value == "none") r.mask = MaskChoice::none;
      else if (value == "causal") r.mask = MaskChoice::causal;
      else if (value == "window") r.mask = MaskChoice::window;
      else throw std::invalid_argument("--mask = '" + value + "'; allowed: none, causal, window");
    } else if (option == "--window") {
      r.window = parse_int(option, value, 0, 1 << 24);
    } else if (option == "--dtype") {
      r.dtype = dtype_from_string(value);
    } else if (option == "--devices") {
      r.devices = parse_int(option, value, 1, kMaxRingDevices);
    } else if (option == "--ordering") {
      r.ordering = ring_ordering_from_string(value);
    } else if (option == "--blocks") {
      std::tie(r.block_rows, r.block_cols) = parse_pair(option, value, 1, 1 << 16);
      r.blocks_from_sram = false;
    } else if (option == "--sram") {
      r.sram_bytes = parse_int(option, value, 1, 1 << 30);
      r.blocks_from_sram = true;
    } else if (option == "--block-rule") {
      r.block_rule = sim::block_rule_from_string(value);
    } else if (option == "--trace") {
      o.trace_path = value;
    } else if (option == "--save-trace") {
      o.save_trace_path = value;
    } else if (option == "--screenshot") {
      o.screenshot_path = value;
    } else if (option == "--layout") {
      o.layout_path = value;
    } else if (option == "--frames") {
      o.frames = parse_int(option, value, 1, 10000);
    } else if (option == "--position") {
      o.position = sim::parse_decimal_real(value, option, 0.0, 1.0, "a fraction of the trace in 0 .. 1");
    } else if (option == "--hover") {
      std::tie(o.hover_row, o.hover_col) = parse_pair(option, value, 0, 1 << 24);
    } else if (option == "--size") {
      std::tie(o.width, o.height) = parse_pair(option, value, 1, 16384);
    } else {
      throw std::invalid_argument("unknown option " + option + "; see --help");
    }
  }
  return o;
}

// The problem runs (or the trace loads) before any window opens, so bad input ends with one
// line on stderr and exit status 2 even without a display.
void prepare(AppState& app, const Options& o) {
  app.request = o.request;
  app.lanes[0].schedule = o.request.schedule;
  for (const std::string* path : {&o.save_trace_path, &o.screenshot_path, &o.layout_path})
    if (!path->empty()) check_output_path(*path);
  if (!o.trace_path.empty()) {
    set_lane_trace(app.lanes[0], load_replay_trace(o.trace_path), std::nullopt);
    return;
  }
  app.compare = !o.compare.empty();
  if (app.compare) app.lanes[1].schedule = o.compare;
  run_lanes(app);
  for (const Lane& lane : app.lanes)
    if (!lane.error.empty()) throw std::invalid_argument(lane.error);
  if (!o.save_trace_path.empty()) save_trace(o.save_trace_path, app.lanes[0].trace);
}

// ---------------------------------------------------------------------------------------------
// Headless output

// Throws OutputFileError (sim/output_file.hpp) when the file cannot be written.
void write_screenshot(const std::string& path, int width, int height) {
  std::vector<unsigned char> pixels(static_cast<std::size_t>(width) * height * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, width, height, GL_RGBA, GL_UNSIGNED_BYTE, pixels.data());
  stbi_flip_vertically_on_write(1);  // OpenGL's first row is the bottom one
  std::string png;
  const auto append = [](void* context, void* data, int size) {
    static_cast<std::string*>(context)->append(static_cast<const char*>(data), static_cast<std::size_t>(size));
  };
  if (!stbi_write_png_to_func(append, &png, width, height, 4, pixels.data(), width * 4))
    throw OutputFileError("output file " + path + ": the PNG could not be encoded");
  write_output_file(path, png);
}

void write_layout(const std::string& path, const AppState& app, int width, int height, float scale_x, float scale_y) {
  const Lane& lane = app.lanes[0];
  const ImVec4 r = lane.score_grid_rect;
  std::ostringstream text;
  text << "{\"framebuffer\": [" << width << ", " << height << "], \"position\": " << lane.cursor.position()
       << ", \"events\": " << lane.cursor.size() << ", \"score_grid\": [" << int(r.x * scale_x) << ", "
       << int(r.y * scale_y) << ", " << int(r.z * scale_x) << ", " << int(r.w * scale_y) << "]}\n";
  write_output_file(path, text.str());
}

// Where score (row, col) of a lane was drawn in the last frame.
ImVec2 score_position(const Lane& lane, int row, int col) {
  const ImVec4 r = lane.score_grid_rect;
  const TraceInfo& info = lane.trace.info;
  return ImVec2(r.x + (std::min(col, info.seqlen_k - 1) + 0.5f) * (r.z - r.x) / info.seqlen_k,
                r.y + (std::min(row, info.seqlen_q - 1) + 0.5f) * (r.w - r.y) / info.seqlen_q);
}

void glfw_error(int code, const char* description) { std::fprintf(stderr, "flashlab_viz: GLFW error %d: %s\n", code, description); }

}  // namespace

int main(int argc, char** argv) {
  AppState app;
  Options options;
  try {
    options = parse_options(argc, argv);
    prepare(app, options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "flashlab_viz: %s\n", error.what());
    return 2;
  }
  const bool headless = !options.screenshot_path.empty();

  // Window and OpenGL 3 context.
  glfwSetErrorCallback(glfw_error);
  if (!glfwInit()) {
    std::fprintf(stderr, "flashlab_viz: cannot open a window (no display? run headless under xvfb-run)\n");
    return 1;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 0);
  glfwWindowHint(GLFW_RESIZABLE, headless ? GLFW_FALSE : GLFW_TRUE);
  GLFWwindow* window = glfwCreateWindow(options.width, options.height, "FlashLab visualizer", nullptr, nullptr);
  if (!window) {
    std::fprintf(stderr, "flashlab_viz: cannot create an OpenGL 3.0 window\n");
    glfwTerminate();
    return 1;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(headless ? 0 : 1);

  // Dear ImGui context and backends.
  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // the layout is computed, not remembered
  ImGui::StyleColorsDark();
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init("#version 130");

  // State: a headless run shows a fixed position of the trace.
  if (headless) {
    app.lanes[0].cursor.seek_fraction(options.position);
    app.lanes[1].cursor.seek_fraction(options.position);
  }

  // The loop.
  int frame = 0;
  int exit_status = 0;
  while (!glfwWindowShouldClose(window)) {
    glfwPollEvents();
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    if (headless && options.hover_row >= 0 && frame > 0) io.MousePos = score_position(app.lanes[0], options.hover_row, options.hover_col);
    ImGui::NewFrame();
    update_lanes(app, headless ? 0.0f : io.DeltaTime);
    ShowApp(app);
    ImGui::Render();

    int width = 0, height = 0;
    glfwGetFramebufferSize(window, &width, &height);
    glViewport(0, 0, width, height);
    glClearColor(0.08f, 0.08f, 0.09f, 1.0f);
    glClear(GL_COLOR_BUFFER_BIT);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());

    if (headless && ++frame >= options.frames) {
      try {
        write_screenshot(options.screenshot_path, width, height);
        if (!options.layout_path.empty())
          write_layout(options.layout_path, app, width, height, width / io.DisplaySize.x, height / io.DisplaySize.y);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "flashlab_viz: %s\n", error.what());
        exit_status = 2;
      }
      break;
    }
    glfwSwapBuffers(window);
  }

  // Cleanup, in reverse order.
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();
  return exit_status;
}
