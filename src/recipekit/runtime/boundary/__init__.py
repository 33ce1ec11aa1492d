"""What crosses between recipekit and a run: the contract both sides agree on, recipe.yaml as the run reads
it, the training order, and the one error and log every runtime module uses. Standard library only.
"""
