#!/usr/bin/env python3
"""Replays a process's memory mappings from `perf script -F tid,time,event,trace,ip,sym` of the
calls scripts/memtrace.sh records, and prints what was mapped when the total peaked: the blocks of
1 MiB or more by allocating stack (their frames in this crate), glibc's arena heaps and the brk
heap. Usage: memtrace.py MAPS_TXT [TOP]

The total is of mappings, not of resident pages: an arena's committed part may be partly untouched,
so it can differ from VmHWM by a few MiB, and in a short run the two peaks can fall at different
moments; in both 250 M runs it fell where VmHWM last rose."""
import collections
import re
import sys

PROT_NONE = 0
MADV_DONTNEED = 4
MAP_FAILED_FROM = 0xFFFFFFFFFFFFF000
EVENT = re.compile(r'^\s*(\d+)\s+([\d.]+):\s+syscalls:(\w+):\s*(.*)$')
ARGUMENT = re.compile(r'(\w+): (0x[0-9a-f]+)')
RETURNED = re.compile(r'(0x[0-9a-f]+)')
ANONYMOUS_FDS = (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF)


class Mappings:
    def __init__(self):
        self.blocks = {}    # start -> [length, stack]
        self.heaps = {}     # arena heap start -> [reserved length, committed length]
        self.pending = {}   # tid -> (call, arguments, frames) until its exit event
        self.brk_start = None
        self.brk_end = None
        self.peak = (0, 0.0, None)
        self.first_time = None

    def total(self):
        blocks = sum(length for length, _ in self.blocks.values())
        return blocks + self.committed() + self.brk_heap()

    def committed(self):
        return sum(committed for _, committed in self.heaps.values())

    def brk_heap(self):
        return (self.brk_end - self.brk_start) if self.brk_start is not None else 0

    def unmap(self, start, length):
        end = start + length
        for block_start in [s for s, (l, _) in self.blocks.items() if s < end and s + l > start]:
            block_length, stack = self.blocks.pop(block_start)
            block_end = block_start + block_length
            if block_start < start:
                self.blocks[block_start] = [start - block_start, stack]
            if block_end > end:
                self.blocks[end] = [block_end - end, stack]
        for heap_start in [s for s, (l, _) in self.heaps.items() if s < end and s + l > start]:
            reserved, committed = self.heaps.pop(heap_start)
            heap_end = heap_start + reserved
            if heap_start < start:
                self.heaps[heap_start] = [start - heap_start, min(committed, start - heap_start)]
            elif heap_end > end:
                # glibc trims a new heap's unaligned head
                self.heaps[end] = [heap_end - end, max(0, committed - (end - heap_start))]

    def heap_holding(self, address):
        for start, (reserved, _) in self.heaps.items():
            if start <= address < start + reserved:
                return start
        return None

    def grow_heap(self, address, end):
        """An arena heap's pages up to `end` made read-write (mprotect)."""
        heap = self.heap_holding(address)
        if heap is not None:
            self.heaps[heap][1] = max(self.heaps[heap][1], end - heap)

    def shrink_heap(self, address):
        """An arena heap given back from `address` on (PROT_NONE again, or MADV_DONTNEED)."""
        heap = self.heap_holding(address)
        if heap is not None:
            self.heaps[heap][1] = min(self.heaps[heap][1], address - heap)

    def mapped(self, call, arguments, frames, returned):
        if call == 'sys_enter_mremap':
            old = self.blocks.pop(arguments['addr'], None)
            self.blocks[returned] = [arguments['new_len'], old[1] if old else stack_of(frames)]
            return
        if arguments['fd'] not in ANONYMOUS_FDS:
            return
        if arguments['prot'] == PROT_NONE:
            if self.heap_holding(returned) is not None:  # glibc shrinking a heap by mapping over it
                self.shrink_heap(returned)
            else:
                self.heaps[returned] = [arguments['len'], 0]
            return
        self.unmap(returned, arguments['len'])
        self.blocks[returned] = [arguments['len'], stack_of(frames)]

    def event(self, tid, time, call, trace, frames):
        if self.first_time is None:
            self.first_time = time
        if call in ('sys_enter_mmap', 'sys_enter_mremap'):
            self.pending[tid] = (call, arguments_of(trace), frames)
            return
        if call in ('sys_exit_mmap', 'sys_exit_mremap'):
            entered = self.pending.pop(tid, None)
            returned = RETURNED.search(trace)
            if entered is None or returned is None or int(returned.group(1), 16) >= MAP_FAILED_FROM:
                return
            self.mapped(entered[0], entered[1], entered[2], int(returned.group(1), 16))
        elif call == 'sys_enter_munmap':
            arguments = arguments_of(trace)
            self.unmap(arguments['addr'], arguments['len'])
        elif call == 'sys_enter_mprotect':
            arguments = arguments_of(trace)
            if arguments['prot'] != PROT_NONE:
                self.grow_heap(arguments['start'], arguments['start'] + arguments['len'])
            else:
                self.shrink_heap(arguments['start'])
        elif call == 'sys_enter_madvise':
            arguments = arguments_of(trace)
            if arguments['behavior'] == MADV_DONTNEED:
                self.shrink_heap(arguments['start'])
        elif call == 'sys_exit_brk':
            returned = RETURNED.search(trace)
            if returned:
                self.brk_end = int(returned.group(1), 16)
                if self.brk_start is None:
                    self.brk_start = self.brk_end
        else:
            return
        total = self.total()
        if total > self.peak[0]:
            by_stack = collections.Counter()
            for length, stack in self.blocks.values():
                by_stack[stack] += length
            self.peak = (total, time - self.first_time, (by_stack, self.committed(), self.brk_heap()))


def arguments_of(trace):
    return {name: int(value, 16) for name, value in ARGUMENT.findall(trace)}


def stack_of(frames):
    """The allocating stack by its frames in this crate (the allocator's own frames say little)."""
    ours = [frame.split(' (')[0] for frame in frames if 'backlinks::' in frame]
    return ' < '.join(ours[:6] if ours else frames[:6])


def replay(lines):
    mappings = Mappings()
    current, frames = None, []
    for line in lines:
        event = EVENT.match(line)
        if event:
            if current:
                mappings.event(*current, frames)
            tid, time, call, trace = event.groups()
            current, frames = (int(tid), float(time), call, trace), []
        elif current and line.strip():
            parts = line.strip().split(None, 1)
            if len(parts) == 2:
                frames.append(parts[1])
    if current:
        mappings.event(*current, frames)
    return mappings


def main():
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    with open(sys.argv[1], errors='replace') as lines:
        mappings = replay(lines)
    total, at, live = mappings.peak
    if live is None:
        sys.exit('memtrace: no mapping calls in the trace')
    by_stack, arenas, brk_heap = live
    mib = 1 << 20
    print(f'mapped at its peak: {total / mib:.1f} MiB at +{at:.1f} s: blocks of 1 MiB or more '
          f'{sum(by_stack.values()) / mib:.1f}, arena heaps {arenas / mib:.1f}, brk heap {brk_heap / mib:.1f}')
    for stack, length in by_stack.most_common(top):
        print(f'{length / mib:8.1f}  {stack[:400]}')


if __name__ == '__main__':
    main()
