//! Payload encoding 4's entropy coder: the byte columns of encoding 3's layout, coded with rANS
//! under the table's column models (docs/format.md "Payload encoding 4", "Column models").
//!
//! zstd codes a frame's byte columns with one Huffman table for all of them, learnt per frame;
//! the columns have very different distributions (a key's top bytes nearly always zero, a source
//! DID's low bytes uniform), so one table for all of them is far from what each carries. Here every column
//! has its own distribution, learnt once per table from a sample of its frames and kept in the
//! meta, in two contexts: whether every earlier byte of the same 8-byte field in the same row is
//! zero (XOR deltas of sorted fields are zero down to their first difference).
//!
//! Invariants:
//! - Every `ByteModel`'s frequencies (256 symbols and the escape) sum to exactly `PROB_SCALE`;
//!   a symbol with frequency 0 is coded as the escape followed by its 8 raw bits, so any byte can
//!   be coded under any model (an untrained model is all escape).
//! - A payload holds the constant-column bitmap, the constant bytes, then one rANS stream of
//!   `LANES` interleaved states (coded byte `k` on state `k % LANES`) and 16-bit words. The
//!   decoder reads exactly the stream's words and ends with every state where the encoder
//!   started, or the payload is rejected; it never reads past the payload, never branches on
//!   whether a state needs a word (one always suffices), and never panics on its bytes.
//! - Counts saturate, model bytes are bounded (`ColumnModels::decode` checks every sum), and a
//!   layout is at most `MAX_FRAME_RAW_BYTES` plus its run lengths.

use super::bytes::FormatError;
use super::bytes::{transpose_into, untransposed};
use std::collections::HashMap;
use xxhash_rust::xxh3::xxh3_64;

/// Probabilities are multiples of 2^-12.
const PROB_BITS: u32 = 12;
const PROB_SCALE: u32 = 1 << PROB_BITS;
/// rANS state lower bound: the state stays in `[RANS_L, 2^32)` between symbols. With 12-bit
/// probabilities one 16-bit word always brings a state back above it, so a decoder reads at most
/// one word per step and needs no loop (and no hard-to-predict branch).
const RANS_L: u32 = 1 << 16;
/// Bytes a renormalization moves: one u16 LE word.
const WORD_BYTES: usize = 2;
/// Index of the escape in a model's frequencies.
const ESCAPE: usize = 256;
const SYMBOLS: usize = 257;
/// Bytes of each rANS state written at the start of the stream.
const STATE_BYTES: usize = 4;
/// Each 8-byte field of a key or rest is one context group; the run length (2 bytes) is one too.
const FIELD_BYTES: usize = 8;
/// Contexts per column: 0 = an earlier byte of the field in this row is nonzero, 1 = none is.
const CONTEXTS: usize = 2;
const WHAT: &str = "frame payload";

/// The byte columns of encoding 3's layout for one entry type: `key_width` key columns over the
/// runs, two run-length columns, `rest_width` rest columns over the entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub key_width: usize,
    pub rest_width: usize,
}

impl Layout {
    pub fn columns(&self) -> usize {
        self.key_width + 2 + self.rest_width
    }

    /// Rows of column `column`: one per run for keys and run lengths, one per entry for rests.
    fn rows(&self, column: usize, runs: usize, entries: usize) -> usize {
        if column < self.key_width + 2 { runs } else { entries }
    }

    /// True when `column` is the first byte of its field (a context group).
    fn starts_field(&self, column: usize) -> bool {
        let (keys, lengths) = (self.key_width, self.key_width + 2);
        match column {
            c if c < keys => c.is_multiple_of(FIELD_BYTES),
            c if c < lengths => c == keys,
            c => (c - lengths).is_multiple_of(FIELD_BYTES),
        }
    }

    /// Length of a layout of `runs` runs over `entries` entries.
    fn len(&self, runs: usize, entries: usize) -> usize {
        runs * (self.key_width + 2) + entries * self.rest_width
    }
}

/// The context of each row while a layout's columns are walked in order: `zero_prefix[row]` is
/// true while every byte of the current field seen so far in that row is zero.
struct ContextWalk {
    layout: Layout,
    runs: usize,
    entries: usize,
    zero_prefix: Vec<bool>,
}

impl ContextWalk {
    fn new(layout: Layout, runs: usize, entries: usize) -> Self {
        ContextWalk { layout, runs, entries, zero_prefix: Vec::with_capacity(entries.max(runs)) }
    }

    /// Starts `column`: resets the row flags at a field start. Returns its rows.
    fn begin(&mut self, column: usize) -> usize {
        let rows = self.layout.rows(column, self.runs, self.entries);
        if self.layout.starts_field(column) {
            self.zero_prefix.clear();
            self.zero_prefix.resize(rows, true);
        }
        rows
    }

    /// The model index of `column` at `row`.
    fn model(&self, column: usize, row: usize) -> usize {
        column * CONTEXTS + usize::from(self.zero_prefix[row])
    }

    fn saw(&mut self, row: usize, byte: u8) {
        self.zero_prefix[row] &= byte == 0;
    }
}

/// One quantized byte distribution with an escape, and its decoding table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ByteModel {
    freq: [u16; SYMBOLS],
    start: [u16; SYMBOLS],
    /// Symbol of each slot below the escape's slots (0 in the escape's, which start at
    /// `start[ESCAPE]`).
    slots: Box<[u8; PROB_SCALE as usize]>,
}

impl ByteModel {
    fn from_freqs(freq: [u16; SYMBOLS]) -> Self {
        let mut start = [0u16; SYMBOLS];
        let mut sum = 0u32;
        for (s, &f) in freq.iter().enumerate() {
            start[s] = sum as u16;
            sum += u32::from(f);
        }
        assert_eq!(sum, PROB_SCALE, "a model's frequencies sum to the scale");
        let mut slots = Box::new([0u8; PROB_SCALE as usize]);
        for s in 0..ESCAPE {
            let range = usize::from(start[s])..usize::from(start[s]) + usize::from(freq[s]);
            slots[range].fill(s as u8);
        }
        ByteModel { freq, start, slots }
    }

    /// Quantizes counts to `PROB_SCALE`: every seen symbol at least 1, the escape weighed as one
    /// count unless all 256 were seen (0 then), the rounding taken from or given to the most
    /// frequent symbols.
    #[cfg(test)]
    fn from_counts(counts: &[u32; 256]) -> Self {
        Self::from_freqs(Self::quantize(counts))
    }

    /// The frequencies `from_counts` gives a model.
    fn quantize(counts: &[u32; 256]) -> [u16; SYMBOLS] {
        let seen = counts.iter().filter(|&&c| c > 0).count();
        let mut weights = [0u64; SYMBOLS];
        weights[..256].iter_mut().zip(counts).for_each(|(w, &c)| *w = u64::from(c));
        weights[ESCAPE] = u64::from(seen < 256);
        // At least 1: an escape, or a byte seen.
        let total: u64 = weights.iter().sum();
        let mut freq = [0u16; SYMBOLS];
        for (f, &w) in freq.iter_mut().zip(&weights) {
            if w > 0 {
                *f = (w * u64::from(PROB_SCALE) / total).max(1) as u16;
            }
        }
        Self::balance(&mut freq);
        freq
    }

    /// Makes the frequencies sum to `PROB_SCALE` by changing the largest ones (never below 1).
    fn balance(freq: &mut [u16; SYMBOLS]) {
        loop {
            let sum: u32 = freq.iter().map(|&f| u32::from(f)).sum();
            if sum == PROB_SCALE {
                return;
            }
            let largest = (0..SYMBOLS).max_by_key(|&s| freq[s]).expect("symbols");
            if sum < PROB_SCALE {
                freq[largest] += (PROB_SCALE - sum) as u16;
            } else {
                let cut = (sum - PROB_SCALE).min(u32::from(freq[largest]) - 1) as u16;
                freq[largest] -= cut;
            }
        }
    }
}

/// How often each byte appeared per column and context, over the frames sampled for a table.
#[derive(Clone, Debug)]
pub struct ModelCounts {
    layout: Layout,
    counts: Vec<[u32; 256]>,
}

impl ModelCounts {
    pub fn new(layout: Layout) -> Self {
        ModelCounts { layout, counts: vec![[0; 256]; layout.columns() * CONTEXTS] }
    }

    /// Counts the bytes of one frame's layout (`runs` runs over `entries` entries).
    pub fn add(&mut self, shuffled: &[u8], runs: usize, entries: usize) {
        assert_eq!(shuffled.len(), self.layout.len(runs, entries));
        let mut walk = ContextWalk::new(self.layout, runs, entries);
        let mut at = 0;
        for column in 0..self.layout.columns() {
            let rows = walk.begin(column);
            for (row, &byte) in shuffled[at..at + rows].iter().enumerate() {
                let count = &mut self.counts[walk.model(column, row)][usize::from(byte)];
                *count = count.saturating_add(1);
                walk.saw(row, byte);
            }
            at += rows;
        }
    }

    pub fn finish(&self) -> ColumnModels {
        ColumnModels::from_freqs(self.layout, self.counts.iter().map(ByteModel::quantize))
    }
}

/// A table's models: two per layout column, each distinct one held once. Most columns of a
/// table are constant or nearly so and share their models, so a decoded set costs about half
/// the memory and the time of building every model (benches/table.rs, `decode_column_models`:
/// 278 KB where one model per column took 678 KB).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnModels {
    layout: Layout,
    distinct: Vec<ByteModel>,
    /// Which of `distinct` model `column * CONTEXTS + context` is.
    model_of: Vec<u16>,
}

impl ColumnModels {
    /// The models of each (column, context) in order, given by their frequencies; equal
    /// frequencies are built once (found by their hash, confirmed by comparing them).
    fn from_freqs(layout: Layout, freqs: impl Iterator<Item = [u16; SYMBOLS]>) -> Self {
        let mut distinct: Vec<ByteModel> = Vec::new();
        let mut by_hash: HashMap<u64, Vec<u16>> = HashMap::new();
        let model_of: Vec<u16> = freqs
            .map(|freq| {
                let candidates = by_hash.entry(hash_freq(&freq)).or_default();
                if let Some(&known) = candidates.iter().find(|&&i| distinct[usize::from(i)].freq == freq) {
                    return known;
                }
                let index = u16::try_from(distinct.len()).expect("a layout has fewer than 2^15 columns");
                distinct.push(ByteModel::from_freqs(freq));
                candidates.push(index);
                index
            })
            .collect();
        assert_eq!(model_of.len(), layout.columns() * CONTEXTS, "one model per column and context");
        ColumnModels { layout, distinct, model_of }
    }

    /// The layout the models code.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Model `column * CONTEXTS + context`.
    fn model(&self, index: usize) -> &ByteModel {
        &self.distinct[usize::from(self.model_of[index])]
    }

    /// Memory the decoded models hold (what a cache counts them as).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.distinct.len() * (std::mem::size_of::<ByteModel>() + PROB_SCALE as usize)
            + self.model_of.len() * std::mem::size_of::<u16>()
    }

    /// Bytes of the uncompressed model section: 257 u16 frequencies per model.
    pub fn encoded_len(layout: Layout) -> usize {
        layout.columns() * CONTEXTS * SYMBOLS * 2
    }

    /// The frequencies as u16 LE, transposed: every model's low bytes, then every high byte.
    pub fn encode(&self) -> Vec<u8> {
        let freq = |i: usize| self.model(i / SYMBOLS).freq[i % SYMBOLS];
        let mut out = Vec::with_capacity(Self::encoded_len(self.layout));
        transpose_into(self.model_of.len() * SYMBOLS, |i| freq(i).to_le_bytes(), &mut out);
        assert_eq!(out.len(), Self::encoded_len(self.layout));
        out
    }

    /// Inverse of `encode`, checking that every model sums to the scale.
    pub fn decode(layout: Layout, bytes: &[u8]) -> Result<Self, FormatError> {
        let expected = Self::encoded_len(layout);
        if bytes.len() != expected {
            return Err(FormatError::Length {
                what: "column models",
                expected: expected as u64,
                found: bytes.len() as u64,
            });
        }
        let count = layout.columns() * CONTEXTS;
        let mut freqs = Vec::with_capacity(count);
        for m in 0..count {
            let freq: [u16; SYMBOLS] =
                std::array::from_fn(|s| u16::from_le_bytes(untransposed(bytes, count * SYMBOLS, m * SYMBOLS + s)));
            let sum: u32 = freq.iter().map(|&f| u32::from(f)).sum();
            if sum != PROB_SCALE {
                let detail = format!("model {m} sums to {sum}, not {PROB_SCALE}");
                return Err(FormatError::Invalid { what: "column models", detail });
            }
            freqs.push(freq);
        }
        Ok(ColumnModels::from_freqs(layout, freqs.into_iter()))
    }
}

/// A hash of a model's frequencies (to find equal ones).
fn hash_freq(freq: &[u16; SYMBOLS]) -> u64 {
    let mut bytes = [0u8; SYMBOLS * 2];
    for (pair, f) in bytes.chunks_exact_mut(2).zip(freq) {
        pair.copy_from_slice(&f.to_le_bytes());
    }
    xxh3_64(&bytes)
}

/// One rANS coding step, in the order the decoder takes them (a frame's steps are kept in a
/// reusable buffer: rANS codes them last first), on one of the `LANES` interleaved states.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    start: u16,
    freq: u16,
    bits: u8,
    lane: u8,
}

/// Interleaved rANS states: coded byte `k` of a frame is on state `k % LANES`, so a decoder
/// works on independent states in turn instead of waiting on one.
const LANES: usize = 4;

/// Appends the payload of one frame's layout (`runs` runs over `entries` entries): a bitmap of
/// the constant columns (bit `i % 8` of byte `i / 8`), each constant column's byte, then the rANS
/// stream of every other column's bytes, column by column, each under its column's model in its
/// row's context.
pub fn encode(
    models: &ColumnModels,
    shuffled: &[u8],
    runs: usize,
    entries: usize,
    steps: &mut Vec<Step>,
    out: &mut Vec<u8>,
) {
    let layout = models.layout;
    assert_eq!(shuffled.len(), layout.len(runs, entries));
    let columns = layout.columns();
    let bitmap_at = out.len();
    out.resize(bitmap_at + columns.div_ceil(8), 0);
    steps.clear();
    let mut walk = ContextWalk::new(layout, runs, entries);
    let (mut at, mut coded) = (0, 0usize);
    for column in 0..columns {
        let rows = walk.begin(column);
        let bytes = &shuffled[at..at + rows];
        at += rows;
        if bytes.iter().all(|&b| b == bytes[0]) {
            out[bitmap_at + column / 8] |= 1 << (column % 8);
            out.push(bytes[0]);
        } else {
            for (row, &byte) in bytes.iter().enumerate() {
                push_steps(models.model(walk.model(column, row)), byte, (coded % LANES) as u8, steps);
                coded += 1;
            }
        }
        for (row, &byte) in bytes.iter().enumerate() {
            walk.saw(row, byte);
        }
    }
    write_stream(steps, out);
}

/// The steps of one byte: its own, or the escape's and then its 8 raw bits.
fn push_steps(model: &ByteModel, byte: u8, lane: u8, steps: &mut Vec<Step>) {
    let s = usize::from(byte);
    let bits = PROB_BITS as u8;
    if model.freq[s] > 0 {
        steps.push(Step { start: model.start[s], freq: model.freq[s], bits, lane });
    } else {
        // Learnt models escape every byte they never saw; only a decoded model may lack an
        // escape, and only learnt ones are used for writing.
        assert!(model.freq[ESCAPE] > 0, "byte {byte} has no code in this model");
        steps.push(Step { start: model.start[ESCAPE], freq: model.freq[ESCAPE], bits, lane });
        steps.push(Step { start: u16::from(byte), freq: 1, bits: 8, lane });
    }
}

/// rANS-codes `steps` (last first, as rANS is last-in first-out) and appends the stream: the
/// final states (u32 LE each, lane 0 first), then the renormalization bytes in the order the
/// decoder reads them.
fn write_stream(steps: &[Step], out: &mut Vec<u8>) {
    let mut words: Vec<u16> = Vec::with_capacity(steps.len() / 2);
    let mut states = [RANS_L; LANES];
    for step in steps.iter().rev() {
        let x = &mut states[usize::from(step.lane)];
        let freq = u32::from(step.freq);
        let x_max = (u64::from(RANS_L >> step.bits) << 16) * u64::from(freq);
        if u64::from(*x) >= x_max {
            words.push(*x as u16);
            *x >>= 16;
        }
        debug_assert!(u64::from(*x) < x_max);
        *x = ((*x / freq) << step.bits) + (*x % freq) + u32::from(step.start);
    }
    states.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
    words.iter().rev().for_each(|word| out.extend_from_slice(&word.to_le_bytes()));
}

/// Reads a rANS stream's words from the front; the states live with the caller (in registers).
struct StreamReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> StreamReader<'a> {
    /// The stream and its initial states.
    fn new(bytes: &'a [u8]) -> Result<(Self, [u32; LANES]), FormatError> {
        let mut states = [0u32; LANES];
        for (lane, x) in states.iter_mut().enumerate() {
            let at = lane * STATE_BYTES;
            let state = bytes.get(at..at + STATE_BYTES).ok_or_else(|| truncated(bytes.len()))?;
            *x = u32::from_le_bytes(state.try_into().expect("four bytes"));
            if *x < RANS_L {
                return Err(invalid(format!("rANS state {x:#x} out of range")));
            }
        }
        Ok((StreamReader { bytes, at: LANES * STATE_BYTES }, states))
    }

    /// Reads one word into a state that fell below `RANS_L`, without branching on it: the
    /// word is read (or taken as 0 past the end, which `finish` then rejects) either way.
    #[inline(always)]
    fn renormalize(&mut self, x: &mut u32) {
        let low = *x < RANS_L;
        let word = match self.bytes.get(self.at..self.at + WORD_BYTES) {
            Some(word) => u32::from(u16::from_le_bytes([word[0], word[1]])),
            None => 0,
        };
        *x = if low { (*x << 16) | word } else { *x };
        self.at += usize::from(low) * WORD_BYTES;
    }

    /// Decodes one byte under `model` from state `x`.
    #[inline(always)]
    fn symbol(&mut self, x: &mut u32, model: &ByteModel) -> u8 {
        let slot = *x & (PROB_SCALE - 1);
        let s = if slot < u32::from(model.start[ESCAPE]) { usize::from(model.slots[slot as usize]) } else { ESCAPE };
        *x = u32::from(model.freq[s]) * (*x >> PROB_BITS) + slot - u32::from(model.start[s]);
        self.renormalize(x);
        if s != ESCAPE {
            return s as u8;
        }
        let raw = *x as u8;
        *x >>= 8;
        self.renormalize(x);
        raw
    }

    /// A stream read exactly to its end (never past it: a read past the end counts bytes it did
    /// not find) and back in the encoder's initial states.
    fn finish(&self, states: [u32; LANES]) -> Result<(), FormatError> {
        if self.at != self.bytes.len() || states != [RANS_L; LANES] {
            return Err(invalid(format!(
                "rANS stream ends at byte {} of {} in states {:x?}",
                self.at,
                self.bytes.len(),
                states
            )));
        }
        Ok(())
    }
}

/// Inverse of `encode`: writes the layout of `runs` runs over `entries` entries into `shuffled`.
pub fn decode(
    models: &ColumnModels,
    payload: &[u8],
    runs: usize,
    entries: usize,
    shuffled: &mut Vec<u8>,
) -> Result<(), FormatError> {
    let layout = models.layout;
    let columns = layout.columns();
    let bitmap = payload.get(..columns.div_ceil(8)).ok_or_else(|| truncated(payload.len()))?;
    let is_constant = |column: usize| bitmap[column / 8] & (1 << (column % 8)) != 0;
    if !columns.is_multiple_of(8) && bitmap[columns / 8] >> (columns % 8) != 0 {
        return Err(invalid("constant-column bitmap has bits past the last column".into()));
    }
    let stream_at = bitmap.len() + (0..columns).filter(|&c| is_constant(c)).count();
    let mut constants = payload.get(bitmap.len()..stream_at).ok_or_else(|| truncated(payload.len()))?.iter();
    // `states[i]` is the state of the coded byte `i` places ahead.
    let (mut stream, mut states) = StreamReader::new(&payload[stream_at..])?;
    shuffled.clear();
    shuffled.resize(layout.len(runs, entries), 0);
    let mut walk = ContextWalk::new(layout, runs, entries);
    let mut at = 0;
    for column in 0..columns {
        let rows = walk.begin(column);
        let out = &mut shuffled[at..at + rows];
        at += rows;
        let zero_prefix = &mut walk.zero_prefix[..rows];
        if is_constant(column) {
            let byte = *constants.next().expect("one constant per set bit");
            out.fill(byte);
            zero_prefix.iter_mut().for_each(|zero| *zero &= byte == 0);
            continue;
        }
        let pair = [models.model(column * CONTEXTS), models.model(column * CONTEXTS + 1)];
        // `LANES` rows at a time, one on each state, then the rest.
        let whole = out.len() / LANES * LANES;
        let (out, out_rest) = out.split_at_mut(whole);
        let (zero_prefix, zero_rest) = zero_prefix.split_at_mut(whole);
        for (bytes, zeros) in out.chunks_exact_mut(LANES).zip(zero_prefix.chunks_exact_mut(LANES)) {
            for lane in 0..LANES {
                bytes[lane] = stream.symbol(&mut states[lane], pair[usize::from(zeros[lane])]);
                zeros[lane] &= bytes[lane] == 0;
            }
        }
        for (lane, (byte, zero)) in out_rest.iter_mut().zip(zero_rest.iter_mut()).enumerate() {
            *byte = stream.symbol(&mut states[lane], pair[usize::from(*zero)]);
            *zero &= *byte == 0;
        }
        states.rotate_left(out_rest.len());
    }
    // Every state ends where the encoder started, whichever lane each is now.
    stream.finish(states)
}

fn truncated(len: usize) -> FormatError {
    invalid(format!("payload of {len} bytes ends early"))
}

fn invalid(detail: String) -> FormatError {
    FormatError::Invalid { what: WHAT, detail }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BACKLINK_LAYOUT: Layout = Layout { key_width: 24, rest_width: 40 };

    /// A layout of `runs` runs over `entries` entries whose bytes are mostly zero, with
    /// `spread` distinct other values: skewed like real XOR columns.
    fn layout_bytes(runs: usize, entries: usize, seed: u64, spread: u8) -> Vec<u8> {
        let mut x = seed | 1;
        (0..BACKLINK_LAYOUT.len(runs, entries))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x.is_multiple_of(3) { (x >> 8) as u8 % spread.max(1) } else { 0 }
            })
            .collect()
    }

    fn models_from(samples: &[(usize, usize, Vec<u8>)]) -> ColumnModels {
        let mut counts = ModelCounts::new(BACKLINK_LAYOUT);
        for (runs, entries, bytes) in samples {
            counts.add(bytes, *runs, *entries);
        }
        counts.finish()
    }

    fn round_trip(models: &ColumnModels, runs: usize, entries: usize, bytes: &[u8]) -> Vec<u8> {
        let (mut steps, mut payload, mut decoded) = (Vec::new(), Vec::new(), Vec::new());
        encode(models, bytes, runs, entries, &mut steps, &mut payload);
        decode(models, &payload, runs, entries, &mut decoded).expect("a payload we wrote decodes");
        decoded
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Any bytes round-trip under any models, including bytes the models never saw
        /// (escapes) and untrained models.
        #[test]
        fn layouts_round_trip_under_models_learnt_elsewhere(
            entries in 1..300usize,
            run_share in 1..=100usize,
            seed in any::<u64>(),
            spread in 1..=255u8,
            trained_spread in 1..=255u8,
            trained in any::<bool>(),
        ) {
            let runs = (entries * run_share / 100).max(1);
            let bytes = layout_bytes(runs, entries, seed, spread);
            let samples = if trained { vec![(runs, entries, layout_bytes(runs, entries, !seed, trained_spread))] } else { vec![] };
            let models = models_from(&samples);
            prop_assert_eq!(round_trip(&models, runs, entries, &bytes), bytes);
        }

        /// A damaged payload is an error or decodes to some bytes; it never panics or reads
        /// past its end.
        #[test]
        fn damaged_payloads_never_panic(seed in any::<u64>(), at in any::<usize>(), flip in 1..=255u8, cut in any::<bool>()) {
            let (runs, entries) = (40, 100);
            let bytes = layout_bytes(runs, entries, seed, 40);
            let models = models_from(&[(runs, entries, bytes.clone())]);
            let (mut steps, mut payload, mut decoded) = (Vec::new(), Vec::new(), Vec::new());
            encode(&models, &bytes, runs, entries, &mut steps, &mut payload);
            let at = at % payload.len();
            if cut { payload.truncate(at) } else { payload[at] ^= flip }
            if decode(&models, &payload, runs, entries, &mut decoded).is_ok() {
                prop_assert_eq!(decoded.len(), bytes.len());
            }
        }
    }

    #[test]
    fn models_learnt_from_the_data_code_it_in_fewer_bytes_than_raw() {
        let (runs, entries) = (100, 256);
        let bytes = layout_bytes(runs, entries, 7, 16);
        let models = models_from(&[(runs, entries, bytes.clone())]);
        let (mut steps, mut payload) = (Vec::new(), Vec::new());
        encode(&models, &bytes, runs, entries, &mut steps, &mut payload);
        // Two thirds zeros and 16 other values: about 2.5 bits a byte.
        assert!(payload.len() * 3 < bytes.len(), "{} bytes coded from {}", payload.len(), bytes.len());
    }

    #[test]
    fn constant_columns_cost_one_byte_and_nothing_in_the_stream() {
        let (runs, entries) = (10, 20);
        let bytes = vec![0u8; BACKLINK_LAYOUT.len(runs, entries)];
        let models = models_from(&[]);
        let (mut steps, mut payload) = (Vec::new(), Vec::new());
        encode(&models, &bytes, runs, entries, &mut steps, &mut payload);
        let columns = BACKLINK_LAYOUT.columns();
        assert_eq!(payload.len(), columns.div_ceil(8) + columns + LANES * STATE_BYTES);
        assert!(steps.is_empty());
        assert_eq!(round_trip(&models, runs, entries, &bytes), bytes);
    }

    #[test]
    fn quantized_models_sum_to_the_scale_and_keep_every_seen_symbol() {
        let mut counts = [0u32; 256];
        counts[0] = u32::MAX;
        counts[1..200].iter_mut().for_each(|c| *c = 1);
        let model = ByteModel::from_counts(&counts);
        assert_eq!(model.freq.iter().map(|&f| u32::from(f)).sum::<u32>(), PROB_SCALE);
        assert!(model.freq[..200].iter().all(|&f| f >= 1));
        assert!(model.freq[200..256].iter().all(|&f| f == 0));
        assert_eq!(model.freq[ESCAPE], 1);
        let all = ByteModel::from_counts(&[1; 256]);
        assert_eq!(all.freq[ESCAPE], 0, "no escape when every byte was seen");
        assert_eq!(ByteModel::from_counts(&[0; 256]).freq[ESCAPE], PROB_SCALE as u16);
    }

    /// Columns with equal frequencies share one built model, and each column still codes with
    /// its own: every (column, context) finds the model its counts quantize to, the shared set
    /// encodes to the same bytes as one model per column built from the counts, and it holds
    /// no model twice.
    #[test]
    fn equal_models_are_built_once() {
        let untrained = models_from(&[]);
        assert_eq!(untrained.distinct.len(), 1, "every untrained model is all escape");
        assert_eq!(untrained.model_of.len(), BACKLINK_LAYOUT.columns() * CONTEXTS);
        let (runs, entries) = (40, 100);
        let bytes = layout_bytes(runs, entries, 11, 30);
        let mut counts = ModelCounts::new(BACKLINK_LAYOUT);
        counts.add(&bytes, runs, entries);
        let learnt = counts.finish();
        let freqs: Vec<[u16; SYMBOLS]> = counts.counts.iter().map(ByteModel::quantize).collect();
        assert!((0..freqs.len()).all(|i| learnt.model(i).freq == freqs[i]), "each column has its own model");
        let unique: std::collections::BTreeSet<&[u16; SYMBOLS]> = freqs.iter().collect();
        assert_eq!(learnt.distinct.len(), unique.len());
        assert!(learnt.distinct.len() < learnt.model_of.len(), "some columns share a model");
        let each_its_own = ColumnModels {
            layout: BACKLINK_LAYOUT,
            distinct: freqs.iter().map(|&f| ByteModel::from_freqs(f)).collect(),
            model_of: (0..freqs.len() as u16).collect(),
        };
        assert_eq!(each_its_own.encode(), learnt.encode());
        assert_eq!(round_trip(&learnt, runs, entries, &bytes), bytes);
        assert!(learnt.memory_bytes() < each_its_own.memory_bytes());
    }

    #[test]
    fn models_round_trip_and_a_bad_sum_is_rejected() {
        let models = models_from(&[(5, 9, layout_bytes(5, 9, 3, 50))]);
        let mut bytes = models.encode();
        assert_eq!(ColumnModels::decode(BACKLINK_LAYOUT, &bytes).unwrap(), models);
        bytes[0] ^= 1;
        assert!(ColumnModels::decode(BACKLINK_LAYOUT, &bytes).is_err());
        assert!(ColumnModels::decode(BACKLINK_LAYOUT, &bytes[1..]).is_err());
    }
}
