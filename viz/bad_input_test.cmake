# Bad input to flashlab_viz (ctest label viz): one line on stderr naming the problem, exit
# status 2, before any window opens (so no display is needed). Inputs: APP, OUT (a folder),
# HOSTILE (tests/viz/hostile_traces: hand-made traces, one per defect that once crashed or hung
# the app). Each run has a time limit, so a hang fails the test instead of stalling it. OUT is
# this test's own folder: the screenshot test, which ctest may run at the same time, writes its
# temporaries beside its own files, and the check for leftovers below must see only ours.
file(MAKE_DIRECTORY ${OUT})
file(WRITE ${OUT}/not_json.json "{\"format\": \"flashlab-trace\", \"version\": ")
file(WRITE ${OUT}/other_version.json "{\"format\": \"flashlab-trace\", \"version\": 99, \"events\": []}")
file(WRITE ${OUT}/not_a_trace.json "{\"traceEvents\": []}")

function(expect_error expected)
  execute_process(COMMAND ${APP} ${ARGN} RESULT_VARIABLE status ERROR_VARIABLE stderr OUTPUT_QUIET TIMEOUT 30)
  string(STRIP "${stderr}" stderr)
  if(NOT status EQUAL 2)
    message(FATAL_ERROR "flashlab_viz ${ARGN}: exit status ${status}, expected 2 (stderr: ${stderr})")
  endif()
  string(FIND "${stderr}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "flashlab_viz ${ARGN}: stderr '${stderr}' does not say '${expected}'")
  endif()
  string(FIND "${stderr}" "\n" newline)
  if(NOT newline EQUAL -1)
    message(FATAL_ERROR "flashlab_viz ${ARGN}: more than one line on stderr: ${stderr}")
  endif()
  message(STATUS "ok: ${stderr}")
endfunction()

expect_error("not valid JSON" --trace ${OUT}/not_json.json)
expect_error("trace format version 99; this build reads version 1" --trace ${OUT}/other_version.json)
expect_error("not a FlashLab trace" --trace ${OUT}/not_a_trace.json)
expect_error("cannot open trace file" --trace ${OUT}/no_such_file.json)
expect_error("too large to animate" --seqlen 5000)
expect_error("block rule 'papr' is unknown; allowed: fitting, paper" --sram 8192 --block-rule papr)
expect_error("flashlab sweep" --seqlen 5000)
expect_error("schedule 'fa9' is unknown" --schedule fa9)
expect_error("--mask = 'diagonal'" --mask diagonal)
expect_error("--seqlen = '010' is not a decimal number" --seqlen 010)
expect_error("--blocks = '064' is not a decimal number" --blocks 64x064)
expect_error("--frames = '5000000000' is out of range; allowed: 1..10000" --frames 5000000000)
expect_error("--position = '0x0.8p0' is not a decimal number" --position 0x0.8p0)
expect_error("unknown option --colour" --colour red)

# Hostile traces: each was a crash or a hang before the loader checked traces against their
# header and the visualizer's limits (viz/limits.hpp).
expect_error("hostile_traces/block_rows_zero.json: top level: field 'block_rows' = 0; allowed: an integer in 1 .. 2147483647"
             --trace ${HOSTILE}/block_rows_zero.json)                      # was: the closed form looped forever
expect_error("event 3: field 'row_sum' is missing; allowed: row_max, row_sum and rescale together"
             --trace ${HOSTILE}/softmax_without_row_sum.json)              # was: SIGSEGV in the softmax panel
expect_error("event 2: field 'rows' = [0,64]; allowed: begin >= 0, size >= 0, begin + size <= 16 (the 16 rows of S)"
             --trace ${HOSTILE}/tile_past_seqlen.json)                     # was: drawn past the score grid
expect_error("event 2: field 'rows' = [9223372036854775807,1]; allowed: begin >= 0"
             --trace ${HOSTILE}/range_overflow.json)                       # was: begin + size overflowed, read as -1
expect_error("problem: seqlen_q = 2147483647 is out of range" --trace ${HOSTILE}/seqlen_2_31.json)  # was: hang
expect_error("65536 x 65536 = 4294967296 block pairs; allowed: at most 16777216"
             --trace ${HOSTILE}/closed_form_2_32_block_pairs.json)          # was: minutes in the closed form
expect_error("number_1e999.json: events[1].sram: the number 1e999 is out of range"
             --trace ${HOSTILE}/number_1e999.json)                         # was: nlohmann's message, no file named
expect_error("trace format version 1.9; this build reads version 1" --trace ${HOSTILE}/version_1_9.json)
expect_error("event 3: field 'row_max' holds 1e+300; allowed: numbers within float's range"
             --trace ${HOSTILE}/float_out_of_range.json)                   # was: a float cast out of range

# A score grid of 4096 x 4096 cells: 2048 one-score tiles on the diagonal of N = 4096 (was: 16.8
# million cells allocated and drawn every frame).
set(events "")
foreach(i RANGE 0 2047)
  math(EXPR row "2 * ${i}")
  string(APPEND events ",{\"kind\":\"compute\",\"tensor\":\"S\",\"rows\":[${row},1],\"cols\":[${row},1],\"op\":\"matmul\",\"sram\":516,\"bytes\":4}")
  string(APPEND events ",{\"kind\":\"free\",\"tensor\":\"S\",\"rows\":[${row},1],\"cols\":[${row},1],\"sram\":512,\"bytes\":4}")
endforeach()
file(READ ${HOSTILE}/valid.json valid)
string(REPLACE "\"seqlen_q\": 16, \"seqlen_k\": 16" "\"seqlen_q\": 4096, \"seqlen_k\": 4096" grid "${valid}")
string(REPLACE "\"bytes\": 256}]}" "\"bytes\": 256}${events}]}" grid "${grid}")
file(WRITE ${OUT}/score_grid_too_fine.json "${grid}")
expect_error("the score grid would have 4096 x 4096 = 16777216 cells" --trace ${OUT}/score_grid_too_fine.json)

# 65 tiles live in SRAM at once: loads never freed.
set(events "")
foreach(i RANGE 1 65)
  math(EXPR sram "512 * (${i} + 1)")
  string(APPEND events ",{\"kind\":\"load\",\"tensor\":\"Q\",\"rows\":[0,8],\"cols\":[0,16],\"sram\":${sram},\"bytes\":512}")
endforeach()
string(REPLACE "\"bytes\": 256}]}" "\"bytes\": 256}${events}]}" live "${valid}")
file(WRITE ${OUT}/too_many_live_tiles.json "${live}")
expect_error("tiles live in SRAM at once; allowed: at most 64" --trace ${OUT}/too_many_live_tiles.json)

# Output files are checked before the work and before a window opens.
file(MAKE_DIRECTORY ${OUT}/a_directory)
expect_error("output file ${OUT}/a_directory is a directory" --seqlen 64 --blocks 32x32 --save-trace ${OUT}/a_directory)
expect_error("output file ${OUT}/a_directory is a directory" --screenshot ${OUT}/a_directory)
expect_error("output file ${OUT}/a_directory is a directory" --screenshot ${OUT}/shot.png --layout ${OUT}/a_directory)
expect_error("directory ${OUT}/missing does not exist" --screenshot ${OUT}/missing/shot.png)
expect_error("output file /proc/flashlab-shot.png cannot be written" --screenshot /proc/flashlab-shot.png)
file(GLOB leftovers ${OUT}/*.partial* ${OUT}/.*.partial*)
if(leftovers)
  message(FATAL_ERROR "temporaries left behind: ${leftovers}")
endif()
