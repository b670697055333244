# The headless test of the visualizer (ctest label viz): two screenshots at different trace
# positions under a virtual X server, then check_screenshots compares them.
# Inputs: XVFB_RUN, APP, CHECK, OUT (a folder).
foreach(position 0.2 0.7)
  execute_process(
    COMMAND ${XVFB_RUN} -a ${APP} --schedule fa2 --seqlen 192 --head-dim 32 --mask causal --blocks 32x32
            --screenshot ${OUT}/viz_${position}.png --layout ${OUT}/viz_${position}.json --frames 3 --position ${position}
    RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "flashlab_viz --screenshot at position ${position} failed with status ${status}")
  endif()
endforeach()
execute_process(COMMAND ${CHECK} ${OUT}/viz_0.2.png ${OUT}/viz_0.2.json ${OUT}/viz_0.7.png ${OUT}/viz_0.7.json
                RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "the screenshots failed their check")
endif()

# Output files through sim/output_file.hpp: the PNG to stdout ("-"), the recorded trace saved and
# replayed from its file, the layout beside them; no temporary left behind.
execute_process(
  COMMAND ${XVFB_RUN} -a ${APP} --schedule fa2 --seqlen 64 --head-dim 16 --blocks 16x16 --save-trace ${OUT}/viz_saved.json
          --screenshot - --layout ${OUT}/viz_stdout_layout.json --frames 2
  OUTPUT_FILE ${OUT}/viz_stdout.png RESULT_VARIABLE status TIMEOUT 60)
execute_process(COMMAND ${XVFB_RUN} -a ${APP} --trace ${OUT}/viz_saved.json --screenshot ${OUT}/viz_replayed.png --frames 2
                RESULT_VARIABLE replay_status TIMEOUT 60)
if(NOT status EQUAL 0 OR NOT replay_status EQUAL 0)
  message(FATAL_ERROR "flashlab_viz --screenshot - / --trace of a saved trace failed: status ${status}, ${replay_status}")
endif()
foreach(png viz_stdout.png viz_replayed.png)
  file(READ ${OUT}/${png} signature LIMIT 8 HEX)
  if(NOT signature STREQUAL "89504e470d0a1a0a")
    message(FATAL_ERROR "${png} is not a PNG (starts ${signature})")
  endif()
endforeach()
file(GLOB leftovers ${OUT}/*.partial* ${OUT}/.*.partial*)
if(leftovers)
  message(FATAL_ERROR "temporaries left behind: ${leftovers}")
endif()
