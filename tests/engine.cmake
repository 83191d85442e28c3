# The training engine: ranks as threads (unit) and as processes under tutti-run (mp).
tutti_add_gtest(engine_test unit engine_test.cpp)
# The timeline started and stopped while the engine runs (Horovod's dynamic timeline).
tutti_add_gtest(engine_timeline_test unit engine_timeline_test.cpp)
# Both read the timeline's JSON back.
target_link_libraries(engine_test PRIVATE nlohmann_json::nlohmann_json)
target_link_libraries(engine_timeline_test PRIVATE nlohmann_json::nlohmann_json)

if(TARGET tutti-run)
  add_executable(engine_mp engine_mp.cpp)
  target_link_libraries(engine_mp PRIVATE tutti tutti_warnings)
  foreach(transport shm tcp)
    foreach(mode steps mismatch stall)
      set(p 3)
      if(mode STREQUAL "mismatch")
        set(p 2)
      endif()
      add_test(NAME engine_${transport}_${mode}
               COMMAND $<TARGET_FILE:tutti-run> -n ${p} --transport ${transport} --timeout-ms 60000
                       $<TARGET_FILE:engine_mp> ${mode})
      set_tests_properties(engine_${transport}_${mode} PROPERTIES LABELS mp TIMEOUT 300)
    endforeach()
  endforeach()
endif()
