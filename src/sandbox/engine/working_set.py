# Run before preimport_check.py in the start-up check's sandbox when sandboxes map the pre-imported
# snapshot's memory copy-on-write (pages/mapped_image.rs): everyday data-analysis steps on the pre-imported
# modules, so that the pages they write are in the working set every sandbox gets copied up front (a
# page first written in a call costs a fault several times dearer than the copy). A step that fails
# (another version of a package, say) only leaves its pages out: the check alone decides whether
# the snapshot is used.
import sys


def warm():
    for step in (_numpy, _pandas, _matplotlib):
        try:
            step()
        except Exception:
            pass


def _numpy():
    if "numpy" in sys.modules:
        np = sys.modules["numpy"]
        rng = np.random.default_rng(0)
        a = rng.normal(size=(50, 50))
        np.linalg.inv(a @ a.T + np.eye(50))
        a.mean(axis=0).std()
        np.percentile(a, [5, 95])
        np.unique(a.round(1))


def _pandas():
    if "pandas" in sys.modules:
        import io

        pd = sys.modules["pandas"]
        csv = "a,b,c\n" + "\n".join(f"{i},{i % 5},{i * 0.5}" for i in range(2000))
        df = pd.read_csv(io.StringIO(csv))
        df.pivot_table(index="b", values="c", aggfunc="mean")
        df.describe()
        df.merge(df.groupby("b").c.mean().rename("m"), left_on="b", right_index=True)
        df["t"] = pd.date_range("2024-01-01", periods=len(df), freq="h")
        df.set_index("t").resample("D").c.mean()
        df.sort_values("c").head().to_string()
        df.loc[df.a > 10, "c"].sum()
        df.to_csv()
        df.to_dict("records")
        repr(df)


def _matplotlib():
    if "matplotlib.pyplot" in sys.modules:
        import io

        plt = sys.modules["matplotlib.pyplot"]
        fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3))
        left.bar(["x", "y", "z"], [3, 5, 2], label="bars")
        left.legend()
        xs = [i / 20 for i in range(200)]
        right.scatter(xs, xs, c=xs, cmap="viridis")
        right.set_xlabel("x")
        right.grid(True)
        fig.savefig(io.BytesIO(), format="png")
        plt.close("all")
