# Run once in a sandbox restored from the snapshot with pre-imported modules, before the engine trusts
# that snapshot: every module must be imported already, and the libraries that were relinked must
# work (numpy's, pandas', matplotlib's, when those are among them). Ends with "ok" as the result.
import sys


def check(modules):
    missing = [name for name in modules if name not in sys.modules]
    if missing:
        raise RuntimeError(f"not imported after the restore: {missing}")
    if "numpy" in sys.modules:
        np = sys.modules["numpy"]
        a = np.arange(12, dtype=float).reshape(3, 4)
        assert float((a @ a.T).trace()) == 506.0
        assert int(np.sort(np.array([3, 1, 2]))[0]) == 1
    if "pandas" in sys.modules:
        pd = sys.modules["pandas"]
        df = pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]})
        assert df.groupby("k").v.sum().to_dict() == {"a": 4, "b": 2}
    if "matplotlib.pyplot" in sys.modules:
        import io

        plt = sys.modules["matplotlib.pyplot"]
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [3, 1, 2])
        ax.set_title("check")
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close("all")
        assert buf.getvalue().startswith(b"\x89PNG")
    return "ok"
