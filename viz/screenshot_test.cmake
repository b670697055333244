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
