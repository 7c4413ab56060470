# SPDX-License-Identifier: Apache-2.0
"""A sample of rmm's allocation log (``LoggingResourceAdaptor``), for the CPU tests of the log
reader and the replay."""

# The shape of rmm's log (logging_resource_adaptor_impl.cpp in librmm 26.x): the header as
# logged with the pattern "%v", then "%t,%H:%M:%S.%f,%v" with "allocate,%p,%zu,%s",
# "allocate failure,%p,%zu,%s" (nullptr: "(nil)") or "free,%p,%zu,%s", the stream as
# rmm::detail::format_stream writes it: `sstr << std::hex << stream.get()`, a cudaStream_t,
# which libstdc++ prints as a pointer: "0" for the default stream, "0x55d9f1a2b3c0" otherwise.
RMM_LOG = """\
Thread,Time,Action,Pointer,Size,Stream
2519617,14:03:27.519214,allocate,0x7f3a5c000000,1048576,0
2519617,14:03:27.519403,allocate,0x7f3a5c100000,256,0x55d9f1a2b3c0
2519620,14:03:27.519650,allocate failure,(nil),1099511627776,0
2519620,14:03:27.519702,free,0x7f3a5c000000,1048576,0
2519617,14:03:27.519810,allocate,0x7f3a5c000000,4096,0x55d9f1a2b3c0
2519620,14:03:27.519901,free,0x7f3a4b000000,512,0
2519617,14:03:27.520033,free,0x7f3a5c000000,4096,0x55d9f1a2b3c0
"""
