"""Unit tests of oracle.py's Tracker: the temporaries a CUDA kernel makes that the fake run's CPU kernel does
not. They need torch (the oracle's venv) and are skipped without it:
$PEAKFIT_ORACLE_VENV/bin/python -m unittest discover -s tools/oracle -p 'test_*.py'"""
import unittest

try:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    import oracle
except ImportError:  # the plain python3 of scripts/test's allocator step: no torch
    torch = None


@unittest.skipIf(torch is None, "needs torch (the oracle's venv)")
class SoftmaxBackward(unittest.TestCase):
    """`softmax_backward_cuda_out` (aten/src/ATen/native/cuda/SoftMax.cu) makes `tmp = grad * output` after
    the structured kernel's output and frees it at return."""

    def backward(self, grad_dtype, input_dtype, shape=(2, 3, 64, 64)):
        fake = FakeTensorMode()
        tr = oracle.Tracker()
        with fake, tr:
            grad = torch.empty(shape, dtype=grad_dtype)
            out = torch.empty(shape, dtype=grad_dtype)
            before = len(tr.events)
            gi = torch.ops.aten._softmax_backward_data(grad, out, -1, input_dtype)
            events = tr.events[before:]
            peak, cur = tr.peak, tr.cur
            del gi
        return events, peak, cur

    def test_the_product_follows_the_output_and_dies_at_return(self):
        n = 2 * 3 * 64 * 64
        events, peak, cur = self.backward(torch.float32, torch.float32)
        self.assertEqual([e[0] for e in events], ["a", "a", "f"])
        (_, out_h, out_n, _), (_, tmp_h, tmp_n, _), free = events
        self.assertEqual(out_n, 4 * n)          # the input gradient, fp32
        self.assertEqual(tmp_n, 4 * n)          # grad * output, fp32
        self.assertEqual(free, ("f", tmp_h))
        self.assertNotEqual(out_h, tmp_h)
        # grad, output, the input gradient and the product were live together
        self.assertEqual(peak, 4 * 4 * n)
        self.assertEqual(cur, 3 * 4 * n)

    def test_half_to_float_keeps_the_product_in_fp32(self):
        # an fp16 input's softmax with dtype=float32: fp32 probabilities and gradient, fp16 input gradient
        n = 2 * 3 * 64 * 64
        events, peak, _ = self.backward(torch.float32, torch.float16)
        (_, _, out_n, _), (_, _, tmp_n, _), _ = events
        self.assertEqual(out_n, 2 * n)
        self.assertEqual(tmp_n, 4 * n)
        self.assertEqual(peak, (4 + 4 + 2 + 4) * n)

    def test_bf16_scores_make_a_bf16_product(self):
        n = 2 * 3 * 64 * 64
        events, _, _ = self.backward(torch.bfloat16, torch.bfloat16)
        self.assertEqual([e[2] for e in events if e[0] == "a"], [2 * n, 2 * n])


@unittest.skipIf(torch is None, "needs torch (the oracle's venv)")
class CudaDropout(unittest.TestCase):
    """`oracle.dropout_cuda` (opt-in, `PEAKFIT_ORACLE_CUDA_DROPOUT=1`): CUDA's one-byte mask, then the output;
    backward one tensor, the mask freed with the graph."""

    def test_a_bool_mask_then_the_output_and_one_gradient(self):
        fake = FakeTensorMode()
        tr = oracle.Tracker()
        n = 4 * 64 * 32
        with fake, tr:
            x = torch.empty((4, 64, 32), dtype=torch.bfloat16, requires_grad=True)
            before = len(tr.events)
            y = oracle.dropout_cuda(x, 0.1, True)
            forward = tr.events[before:]
            grad = torch.empty_like(y)
            mid = len(tr.events)
            y.backward(grad)
            backward = [e[2] for e in tr.events[mid:] if e[0] == "a"]
        self.assertEqual([e[2] for e in forward if e[0] == "a"], [n, 2 * n])
        # the input's gradient (x is a leaf: it becomes x.grad), no copy of the mask
        self.assertEqual(backward, [2 * n])
        # the mask is freed with the graph: the backward's last frees
        freed = [e for e in tr.events[mid:] if e[0] == "f"]
        self.assertIn(forward[0][1], [e[1] for e in freed])
        # at probability 0 (or in eval) the input itself
        self.assertIs(oracle.dropout_cuda(x, 0.0, True), x)


if __name__ == "__main__":
    unittest.main()
