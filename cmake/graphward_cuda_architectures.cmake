# graphward_cuda_architectures(OUT SMI): the CUDA architectures to build for when the user did not
# choose (CMAKE_CUDA_ARCHITECTURES): those of the GPUs `SMI` (nvidia-smi) reports on this machine,
# each as "<cc>" (its machine code plus PTX), deduplicated and sorted; where it reports none (no
# GPU, no driver: a CI machine), 90 (Hopper). Capabilities below 8.0 are dropped with a warning:
# graphward's kernels need 8.0 or newer (bfloat16 arithmetic).
function(graphward_cuda_architectures out smi)
  set(archs "")
  if(smi)
    execute_process(COMMAND ${smi} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 20)
    if(rc EQUAL 0)
      string(REPLACE "\n" ";" caps "${caps}")
      foreach(cap IN LISTS caps)
        string(STRIP "${cap}" cap)
        if(cap MATCHES "^([0-9]+)\\.([0-9]+)$")
          set(arch "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
          if(arch LESS 80)
            message(WARNING "graphward: a GPU of compute capability ${cap} is left out: graphward "
                            "needs 8.0 or newer")
          else()
            list(APPEND archs ${arch})
          endif()
        endif()
      endforeach()
    endif()
  endif()
  list(REMOVE_DUPLICATES archs)
  list(SORT archs COMPARE NATURAL)
  if(archs)
    set(${out} "${archs}" PARENT_SCOPE)
  else()
    set(${out} 90 PARENT_SCOPE)
  endif()
endfunction()

# `cmake -DSMI=<program> -P graphward_cuda_architectures.cmake` prints what it would choose (the
# tests run it with stand-ins for nvidia-smi).
if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  graphward_cuda_architectures(chosen "${SMI}")
  message(STATUS "graphward CUDA architectures: ${chosen}")
endif()
