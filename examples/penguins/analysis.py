# The demo analysis: runs inside the sandbox with the scope root as its working directory.
# Reads docs/penguins.csv, writes a dataset, a chart and a report into the scope's folders.
import os

import matplotlib.pyplot as plt
import pandas as pd

penguins = pd.read_csv("docs/penguins.csv")
print(f"loaded {len(penguins)} penguins, {penguins['body_mass_g'].isna().sum()} without a body mass")

summary = (
    penguins.dropna(subset=["body_mass_g"])
    .groupby("species")
    .agg(
        count=("body_mass_g", "size"),
        mean_body_mass_g=("body_mass_g", "mean"),
        sd_body_mass_g=("body_mass_g", "std"),
        mean_flipper_mm=("flipper_length_mm", "mean"),
    )
    .round(1)
    .sort_values("mean_body_mass_g", ascending=False)
)
os.makedirs("datasets", exist_ok=True)
summary.to_csv("datasets/species_summary.csv")
print(summary.to_string())

fig, ax = plt.subplots(figsize=(6, 4))
for species, group in penguins.dropna(subset=["body_mass_g"]).groupby("species"):
    ax.hist(group["body_mass_g"], bins=20, alpha=0.6, label=species)
ax.set_xlabel("body mass (g)")
ax.set_ylabel("penguins")
ax.set_title("Body mass by species (Palmer penguins)")
ax.legend()
os.makedirs("charts", exist_ok=True)
fig.savefig("charts/body_mass.png", dpi=120, bbox_inches="tight")
plt.show()  # a no-op under the Agg backend: the sandbox is headless

heaviest = summary.index[0]
os.makedirs("reports", exist_ok=True)
with open("reports/summary.md", "w", encoding="utf-8") as fh:
    fh.write("# Body mass of Palmer penguins by species\n\n")
    fh.write(f"{heaviest} penguins are the heaviest, at {summary.loc[heaviest, 'mean_body_mass_g']:.0f} g on average.\n\n")
    fh.write("```\n" + summary.to_string() + "\n```\n")
    fh.write("\nSource: docs/penguins.csv (Horst, Hill and Gorman 2020, CC0).\n")
print("wrote datasets/species_summary.csv, charts/body_mass.png, reports/summary.md")
