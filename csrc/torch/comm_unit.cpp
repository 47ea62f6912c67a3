// The collective layer compiled as one translation unit (setup.py builds this file in
// place of the three it includes): each of them includes c10d's headers, whose parsing and
// inline functions are most of its compile time; apart they took 129 s of CPU on a 2-core
// machine, together 52 s.
#include "timed_work.cpp"
#include "timed_backend.cpp"
#include "bind_comm.cpp"
