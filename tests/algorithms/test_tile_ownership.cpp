// TileMemory::holds and Tile::arena: which memory model a tile lives in, what the Python bindings
// check before an op reads a tile (python/src/schedule_arguments.hpp).
#include <utility>

#include "algorithms/tile_memory.hpp"
#include "catch.hpp"

using namespace flashlab;

TEST_CASE("a tile is held by the model that made it until it is moved from", "[tile_memory]") {
  DataMemory mem;
  ShapeMemory other;
  Tile tile = mem.zeros(TensorId::S, {0, 4}, {0, 8});
  CHECK(mem.holds(tile));
  CHECK_FALSE(other.holds(tile));
  CHECK(tile.arena() != nullptr);

  Tile moved = std::move(tile);
  CHECK(mem.holds(moved));
  CHECK_FALSE(mem.holds(tile));
  CHECK(tile.arena() == nullptr);
  CHECK(mem.sram_in_use_bytes() == 4 * 8 * 4);

  moved = Tile();  // freed
  CHECK_FALSE(mem.holds(moved));
  CHECK(mem.sram_in_use_bytes() == 0);
  CHECK_FALSE(mem.holds(Tile()));
}
