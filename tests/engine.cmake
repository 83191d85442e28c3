# The training engine: ranks as threads (unit) and as processes under tutti-run (mp).
tutti_add_gtest(engine_test unit engine_test.cpp)
